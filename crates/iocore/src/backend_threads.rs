//! Where a backend's own threads (librbd's, for an `rbd=` disk) run, and under which filter.

use sandbox::{Filter, SandboxError, SeccompMode, ThreadKind};

/// What a backend's own thread runs before anything else (for
/// `storage::rbd::set_up_client_threads`): it moves to `cpus`, if any, then installs the filter
/// of `kind` in `mode`. Give it the IOCores' CPUs when they are pinned: an IOCore sleeps while it
/// waits for such threads, so its core is free for them, and the vCPUs keep theirs (a polling
/// guest spins on its vCPU's core, and a thread woken there waits behind it).
pub fn backend_thread_set_up(
    kind: ThreadKind,
    mode: SeccompMode,
    cpus: Vec<usize>,
) -> Result<impl Fn() -> Result<(), String> + Send + Sync + 'static, SandboxError> {
    let filter = Filter::new(kind, mode)?;
    Ok(move || {
        if !cpus.is_empty() {
            crate::place_current_thread(&cpus)
                .map_err(|e| format!("cannot place it on CPUs {cpus:?}: {e}"))?;
        }
        filter.install().map_err(|e| e.to_string())
    })
}
