//! vhost-user: message parsing (`Message::parse`) and the per-connection state machine
//! (`Session::handle`), fed sequences of messages as `server.rs` feeds them (a refused message
//! ends the connection, and the next one gets a new session), with real descriptors attached:
//! memfds for memory tables, eventfds, pipes (one with its reader gone), sockets, /dev/null, and
//! sealed memfds of arbitrary contents as in-flight regions (SET_INFLIGHT_FD), which the next
//! ring to start recovers from, and as dirty logs (SET_LOG_BASE, of plausible and arbitrary
//! sizes and offsets), with SET_LOG_FD and VHOST_VRING_F_LOG rings.
//! Between messages the frontend's guest posts virtio-blk requests in the shared memory, and the
//! running rings' workers are polled. Nothing may panic; after a poll nothing is left in flight
//! (RAM disks); when a connection ends, every ring it started has been stopped.
#![no_main]

use std::fs::File;
use std::sync::{Arc, Once};

use arbitrary::{Result, Unstructured};
use exitless_fuzz::vhost::{frontend_memory, message, start_ring, InlineHost};
use exitless_fuzz::{queue_config, ram_disk, DriverRing, MAX_STEPS};
use libfuzzer_sys::fuzz_target;
use vhost_user::{Session, VhostUserBlk};
use vhost_user_protocol::message::Message;
use virtio::block::Block;
use vm_memory::GuestMemoryMmap;

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});

fn run(u: &mut Unstructured) -> Result<()> {
    static IGNORE_SIGPIPE: Once = Once::new();
    // As Rust's runtime does for the exitless binary (libFuzzer's main is not Rust's): a write
    // to a pipe or socket whose reader is gone is an EPIPE error, not a fatal signal.
    // SAFETY: setting a signal's disposition to "ignore" has no memory-safety effect.
    IGNORE_SIGPIPE.call_once(|| unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    });
    let (memfd, mem) = frontend_memory();
    let queues = u.int_in_range(1..=2)?;
    let backends = (0..queues).map(|_| Box::new(ram_disk(false)) as Box<dyn storage::Backend>).collect();
    let block =
        Block::with_queues(backends, "exitless-fuzz-vhost").expect("two queues fit").with_writeback_switch();
    let host = Arc::new(InlineHost::default());
    let mut device = VhostUserBlk::new(block, host.clone());
    let features = vhost_user::backend::offered_features(&device);
    // The frontend's guest, on each queue's rings where SET_VRING_ADDR mostly puts them.
    let mut rings = Vec::with_capacity(2);
    for q in 0..2 {
        let (config, laid_out) = queue_config(u, q)?;
        rings.push(DriverRing::new(config, laid_out));
    }
    let mut steps = 0;
    while steps < MAX_STEPS && !u.is_empty() {
        // One connection; its session ends (is dropped) with it, however it ends.
        let outcome = connection(u, device.session(), memfd, &mem, &mut rings, &host, features, &mut steps);
        assert_eq!(host.attached(), 0, "a connection ended with rings still running");
        if !outcome? {
            return Ok(());
        }
    }
    Ok(())
}

/// Serve one connection until a message is refused (as the server closes the connection then)
/// or the steps run out. `Ok(false)`: the input ends here (it would only meet an open bug).
#[allow(clippy::too_many_arguments)]
fn connection(
    u: &mut Unstructured,
    mut session: Session,
    memfd: &File,
    mem: &GuestMemoryMmap,
    rings: &mut [DriverRing],
    host: &InlineHost,
    features: u64,
    steps: &mut usize,
) -> Result<bool> {
    while *steps < MAX_STEPS && !u.is_empty() {
        *steps += 1;
        let messages = match u.int_in_range(0..=8)? {
            0..=3 => vec![message(u, memfd, features, rings)?],
            4 => {
                let index = u.int_in_range(0..=1)?;
                start_ring(u, memfd, features, &rings[index as usize], index)?
            }
            5 | 6 => {
                rings[usize::from(u.ratio(1, 2)?)].blk_request(u, mem)?;
                vec![]
            }
            7 => {
                rings[usize::from(u.ratio(1, 2)?)].driver_step(u, mem)?;
                vec![]
            }
            _ => {
                host.poll();
                vec![]
            }
        };
        let refused = messages.into_iter().any(|(header, payload, fds)| {
            Message::parse(header, &payload, fds)
                .map_err(vhost_user::Error::from)
                .and_then(|m| session.handle(m))
                .is_err()
        });
        if refused {
            break;
        }
    }
    Ok(true)
}
