//! glibc's malloc reads two files the first time it needs what they say, on whichever thread
//! that happens to be: /sys/devices/system/cpu/online (`get_nprocs`), to size the number of
//! arenas once a process has more than eight, and /proc/sys/vm/overcommit_memory
//! (`check_may_shrink_heap`), the first time a thread arena's heap shrinks after a `free`. A
//! confined thread may open neither: under kill mode that `openat` killed the process (an
//! IOCore freeing buffers another thread had allocated, when an RBD disk's threads had made
//! the process many arenas). [`settle_allocator`] makes glibc read both before any filter.

use std::sync::Once;

/// Arenas per CPU: glibc's own limit on 64-bit (`NARENAS_FROM_NCORES`).
const ARENAS_PER_CPU: usize = 8;
/// Blocks a helper thread allocates and frees to make its arena's heap shrink: together more
/// than glibc's trim threshold (128 KiB), each below its mmap threshold (128 KiB), so that they
/// come from the heap and, freed, merge into its top.
const SHRINK_BLOCKS: usize = 8;
const SHRINK_BLOCK_BYTES: usize = 64 << 10;

/// Have glibc's malloc settle, now, what it would otherwise read from a file later on any
/// thread (see the module's doc): the arena limit, set to glibc's own default, and whether a
/// heap may shrink. Call it before any thread installs a filter; later calls do nothing.
pub fn settle_allocator() {
    static SETTLED: Once = Once::new();
    SETTLED.call_once(|| {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let arenas = i32::try_from(cpus.saturating_mul(ARENAS_PER_CPU)).unwrap_or(i32::MAX);
        // SAFETY: mallopt takes two integers and changes only malloc's parameters.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) };
        // A new thread allocates from an arena of its own (not the main one, whose heap
        // shrinks without that check); freeing the blocks shrinks its heap.
        let shrink = std::thread::Builder::new().name("malloc-settle".into()).spawn(|| {
            let blocks: Vec<Vec<u8>> =
                (0..SHRINK_BLOCKS).map(|_| std::hint::black_box(vec![1u8; SHRINK_BLOCK_BYTES])).collect();
            drop(std::hint::black_box(blocks));
        });
        if let Ok(thread) = shrink {
            let _ = thread.join();
        }
    });
}
