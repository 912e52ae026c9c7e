//! The hand-over channel as a successor daemon reads it from its predecessor
//! (`vhost_user::handover::read_as_successor`): DISK messages (index, message count, connection
//! flag, cache mode, the listening and connected sockets as descriptors), each followed by the
//! vhost-user messages that rebuild its frontend's session, which are replayed into a new
//! session of a block device with its rings held (`Message::parse`, `Session::handle`: the
//! checks a frontend's messages get), then DONE, REFUSE, unknown codes or bytes that are no
//! message at all. The messages are mostly what a predecessor sends (QEMU's ring start-up
//! sequence, SET_INFLIGHT_FD with a region of arbitrary contents), with real descriptors, and
//! sometimes anything: counts that lie, descriptors missing or of the wrong kind, requests a
//! hand-over never replays, a channel cut mid-message.
//!
//! Checks besides "no panic" and "no hang" (everything is written, as far as the socket's buffer
//! takes it, and the channel closed before the successor reads): no ring is ever started (a successor serves nothing before the
//! predecessor's commit), and a channel that ends with DONE after well-formed disks without a
//! connection is taken, with every disk.
#![no_main]

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Once};
use std::time::Duration;

use arbitrary::{Result, Unstructured};
use exitless_fuzz::vhost::{descriptor, frontend_memory, message, start_ring, InlineHost, Raw};
use exitless_fuzz::{queue_config, ram_disk, DriverRing, MAX_STEPS};
use libfuzzer_sys::fuzz_target;
use vhost_user::handover::{code, read_as_successor};
use vhost_user::VhostUserBlk;
use vhost_user_protocol::message::{Header, Wire, VERSION};
use virtio::block::Block;

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});

fn send(wire: &Wire, (header, payload, fds): &Raw) -> bool {
    let fds: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    wire.send(*header, payload, &fds).is_ok()
}

fn raw(request: u32, payload: Vec<u8>, fds: Vec<OwnedFd>) -> Raw {
    (Header { request, flags: VERSION, size: payload.len() as u32 }, payload, fds)
}

fn run(u: &mut Unstructured) -> Result<()> {
    static IGNORE_SIGPIPE: Once = Once::new();
    // As Rust's runtime does for the exitless binary (libFuzzer's main is not Rust's).
    // SAFETY: setting a signal's disposition to "ignore" has no memory-safety effect.
    IGNORE_SIGPIPE.call_once(|| unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    });
    let (memfd, _mem) = frontend_memory();
    let queues = u.int_in_range(1..=2)?;
    let backends = (0..queues).map(|_| Box::new(ram_disk(false)) as Box<dyn storage::Backend>).collect();
    let block = Block::with_queues(backends, "exitless-fuzz-handover")
        .expect("two queues fit")
        .with_writeback_switch();
    let host = Arc::new(InlineHost::default());
    let mut device = VhostUserBlk::new(block, host.clone());
    let features = vhost_user::backend::offered_features(&device);
    let mut rings = Vec::with_capacity(2);
    for q in 0..2 {
        let (config, laid_out) = queue_config(u, q)?;
        rings.push(DriverRing::new(config, laid_out));
    }

    let (predecessor, successor) = UnixStream::pair().expect("socketpair");
    // Everything is written before the successor reads: a write the socket's buffer has no room
    // for fails at once (it would wait for a reader that never comes), and the channel is cut
    // there, mid-message or not.
    predecessor.set_nonblocking(true).expect("a non-blocking socket");
    let wire = Wire::new(&predecessor, Duration::ZERO);
    // Disks announced without a connection, each well formed, and nothing else bent: the
    // channel must be taken if it ends with DONE.
    let mut plain_disks = 0;
    let mut only_plain = true;
    let mut done = false;
    for _ in 0..MAX_STEPS / 4 {
        if u.is_empty() {
            break;
        }
        match u.int_in_range(0..=9)? {
            0..=5 => {
                let connected = u.ratio(1, 2)?;
                let mut session: Vec<Raw> = Vec::new();
                if connected {
                    for _ in 0..u.int_in_range(0..=3)? {
                        if u.ratio(1, 2)? {
                            let index = u.int_in_range(0..=1)?;
                            session.extend(start_ring(u, memfd, features, &rings[index as usize], index)?);
                        } else {
                            session.push(message(u, memfd, features, &rings)?);
                        }
                    }
                }
                let index: u32 = if u.ratio(1, 8)? { u.arbitrary()? } else { u.int_in_range(0..=2)? };
                let count: u32 = if u.ratio(1, 8)? { u.arbitrary()? } else { session.len() as u32 };
                let flag: u8 = if u.ratio(1, 16)? { u.arbitrary()? } else { connected.into() };
                let writeback: u8 = match u.int_in_range(0..=7)? {
                    0 => u.arbitrary()?,
                    1..=3 => u.int_in_range(0..=1)?,
                    _ => u8::MAX,
                };
                let mut payload = index.to_le_bytes().to_vec();
                payload.extend_from_slice(&count.to_le_bytes());
                payload.extend_from_slice(&[flag, writeback]);
                let mut bent = false;
                if u.ratio(1, 16)? {
                    bent = true;
                    payload.truncate(u.int_in_range(0..=payload.len())?);
                }
                // The listening socket, and the frontend's connected one.
                let mut fds: Vec<OwnedFd> = vec![UnixStream::pair().expect("socketpair").0.into()];
                if connected {
                    fds.push(UnixStream::pair().expect("socketpair").0.into());
                }
                if u.ratio(1, 16)? {
                    bent = true;
                    if u.ratio(1, 2)? {
                        fds.pop();
                    } else {
                        fds.push(descriptor(u, memfd, false)?);
                    }
                }
                let cache_mode = writeback <= 1 || writeback == u8::MAX;
                only_plain &= !connected && !bent && count == 0 && flag == 0 && cache_mode;
                plain_disks += 1;
                if !send(&wire, &raw(code::DISK, payload, fds)) || session.iter().any(|m| !send(&wire, m)) {
                    only_plain = false;
                    break;
                }
            }
            6 => {
                let fds = if u.ratio(7, 8)? {
                    vec![UnixStream::pair().expect("socketpair").0.into()]
                } else {
                    vec![]
                };
                done = !fds.is_empty() && send(&wire, &raw(code::DONE, vec![], fds));
                break;
            }
            7 => {
                only_plain = false;
                let len = u.int_in_range(0..=64)?;
                let _ = send(&wire, &raw(code::REFUSE, u.bytes(len.min(u.len()))?.to_vec(), vec![]));
            }
            8 => {
                only_plain = false;
                let request =
                    if u.ratio(1, 2)? { u.arbitrary()? } else { u.int_in_range(code::HELLO..=code::COMMIT)? };
                let len = u.int_in_range(0..=32)?;
                let _ = send(&wire, &raw(request, u.bytes(len.min(u.len()))?.to_vec(), vec![]));
            }
            _ => {
                // Bytes that are no message (a header cut short, a size that lies).
                only_plain = false;
                let len = u.int_in_range(0..=32)?;
                let _ = (&predecessor).write_all(u.bytes(len.min(u.len()))?);
            }
        }
    }
    // The predecessor is done: the successor reads what is there, then the end of the channel.
    drop(wire);
    let _ = predecessor.shutdown(std::net::Shutdown::Write);
    let outcome = read_as_successor(&successor, &mut device, Duration::from_secs(1));
    assert_eq!(host.attached(), 0, "a ring started during a hand-over, before any commit");
    if done && only_plain {
        assert_eq!(outcome.ok(), Some(plain_disks), "well-formed disks without a connection, then DONE");
    }
    Ok(())
}
