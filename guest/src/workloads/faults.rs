//! Workloads that misbehave on purpose, for the VMM's own tests.

/// Raise #UD with the exception handlers installed: the probe reports it and exits.
pub fn invalid_opcode() -> u8 {
    // SAFETY: deliberately executes an invalid opcode; the ring-0 handler never returns.
    unsafe { core::arch::asm!("ud2", options(noreturn)) }
}

/// Never exit: for `--timeout`.
pub fn spin_forever() -> ! {
    loop {
        core::hint::spin_loop();
    }
}
