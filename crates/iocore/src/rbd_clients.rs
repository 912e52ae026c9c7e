//! Where librbd's threads (an `rbd=` disk's) run, and under which filter.

use sandbox::{Filter, SandboxError, SeccompMode, ThreadKind};

/// Have librbd's threads run under the RBD client filter in `mode` and, if `cpus` names any, on
/// those CPUs only. Give it the IOCores' CPUs when they are pinned: an IOCore sleeps while it
/// waits for librbd, so its core is free for librbd's threads, and the vCPUs keep theirs (a
/// polling guest spins on its vCPU's core, and a librbd thread woken there waits behind it).
/// Call it before the first RBD disk opens.
pub fn set_up_rbd_clients(mode: SeccompMode, cpus: Vec<usize>) -> Result<(), SandboxError> {
    let filter = Filter::new(ThreadKind::RbdClient, mode)?;
    storage::rbd::set_up_client_threads(Box::new(move || {
        if !cpus.is_empty() {
            crate::place_current_thread(&cpus)
                .map_err(|e| format!("cannot place it on CPUs {cpus:?}: {e}"))?;
        }
        filter.install().map_err(|e| e.to_string())
    }));
    Ok(())
}
