//! `exitless udp-flood` and `exitless udp-count`: the bare-metal frame rate, the host's side of
//! the probe's `frames-send` and `frames-count`. The flood sends 18-byte UDP datagrams (60-byte
//! frames, 64 with the FCS) as fast as the kernel takes them, 64 to a `sendmmsg`; the counter
//! takes them 64 to a `recvmmsg`, spinning on a non-blocking socket. Each datagram holds its
//! sequence number (u64, little-endian) and zeroes, as the probe's do, so the counter tells
//! the frames lost.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use clap::Args;
use exitless_args::fail;
use serde_json::json;

use super::{connected, pin, UdpError};

/// UDP payload bytes: with Ethernet, IPv4 and UDP headers, a 60-byte frame.
pub const PAYLOAD: usize = 18;
/// Frame bytes, without the FCS.
const FRAME: usize = 60;
/// Datagrams per system call.
const BATCH: usize = 64;

/// The command line of `exitless udp-flood`.
#[derive(Args)]
pub struct UdpFloodArgs {
    /// Where the datagrams go (an `exitless udp-count`).
    #[arg(long, value_name = "ADDR:PORT")]
    pub to: SocketAddr,
    /// How long to send, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub duration_ms: u64,
    /// Pin to this host CPU.
    #[arg(long, value_name = "CPU")]
    pub cpu: Option<usize>,
}

/// The command line of `exitless udp-count`.
#[derive(Args)]
pub struct UdpCountArgs {
    /// Address and port to count on.
    #[arg(long, value_name = "ADDR:PORT")]
    pub bind: SocketAddr,
    /// How long to wait for the first datagram, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    pub wait_ms: u64,
    /// Stop once none came for this many milliseconds (after the first).
    #[arg(long, value_name = "MS", default_value_t = 200)]
    pub idle_ms: u64,
    /// Pin to this host CPU.
    #[arg(long, value_name = "CPU")]
    pub cpu: Option<usize>,
}

/// Run `exitless udp-flood` and print its JSON result line; the process's exit status.
pub fn flood(args: UdpFloodArgs) -> i32 {
    match run_flood(&args) {
        Ok(line) => {
            println!("{line}");
            0
        }
        Err(e) => fail(e),
    }
}

/// Run `exitless udp-count` and print its JSON result line; the process's exit status.
pub fn count(args: UdpCountArgs) -> i32 {
    match run_count(&args) {
        Ok(line) => {
            println!("{line}");
            0
        }
        Err(e) => fail(e),
    }
}

/// `BATCH` datagrams' buffers and the headers `sendmmsg` and `recvmmsg` take, pointing into
/// them. Boxed, so that the pointers stay good when it moves.
struct Batch {
    payloads: Box<[[u8; PAYLOAD]; BATCH]>,
    /// What `headers` point at; never read here.
    _iovecs: Box<[libc::iovec; BATCH]>,
    headers: Box<[libc::mmsghdr; BATCH]>,
}

impl Batch {
    fn new() -> Batch {
        let mut payloads = Box::new([[0u8; PAYLOAD]; BATCH]);
        let mut iovecs: Box<[libc::iovec; BATCH]> =
            Box::new([libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; BATCH]);
        // SAFETY: mmsghdr is plain old data; all-zero is an empty message with no name.
        let mut headers: Box<[libc::mmsghdr; BATCH]> = Box::new(unsafe { std::mem::zeroed() });
        for ((payload, iovec), header) in payloads.iter_mut().zip(iovecs.iter_mut()).zip(headers.iter_mut()) {
            *iovec = libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: PAYLOAD };
            header.msg_hdr.msg_iov = iovec;
            header.msg_hdr.msg_iovlen = 1;
        }
        Batch { payloads, _iovecs: iovecs, headers }
    }
}

fn run_flood(args: &UdpFloodArgs) -> Result<serde_json::Value, UdpError> {
    pin(args.cpu)?;
    let socket = connected(args.to)?;
    let mut batch = Batch::new();
    let (mut sent, mut refused) = (0u64, 0u64);
    let started = Instant::now();
    let deadline = started + Duration::from_millis(args.duration_ms);
    while Instant::now() < deadline {
        for (i, payload) in batch.payloads.iter_mut().enumerate() {
            payload[..8].copy_from_slice(&(sent + i as u64).to_le_bytes());
        }
        // SAFETY: `headers` holds BATCH messages, each one iovec (in `batch._iovecs`) over its
        // PAYLOAD-byte buffer in `batch.payloads`; all three live in `batch`, which outlives the
        // call, and the kernel only reads them.
        let n = unsafe {
            libc::sendmmsg(socket.as_raw_fd(), batch.headers.as_mut_ptr(), BATCH as libc::c_uint, 0)
        };
        match usize::try_from(n) {
            Ok(n) => sent += n as u64,
            Err(_) => {
                let e = io::Error::last_os_error();
                // The kernel dropped the datagram for want of room: send again.
                if e.raw_os_error() != Some(libc::ENOBUFS) {
                    return Err(UdpError::Send(e));
                }
                refused += 1;
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(json!({
        "probe": "udp-flood",
        "ops": sent,
        "fps": sent as f64 / seconds,
        "ms": (seconds * 1000.0) as u64,
        "size": FRAME,
        "refused": refused,
    }))
}

fn run_count(args: &UdpCountArgs) -> Result<serde_json::Value, UdpError> {
    let socket = UdpSocket::bind(args.bind).map_err(|source| UdpError::Bind { at: args.bind, source })?;
    pin(args.cpu)?;
    socket.set_nonblocking(true).map_err(UdpError::Socket)?;
    let mut batch = Batch::new();
    let (mut counted, mut highest) = (0u64, None::<u64>);
    let (mut first, mut last) = (None::<Instant>, Instant::now());
    let waiting = Instant::now();
    loop {
        // SAFETY: as in `run_flood`; the kernel writes at most PAYLOAD bytes into each
        // message's buffer, all of which live in `batch`.
        let n = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                batch.headers.as_mut_ptr(),
                BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        let Ok(n) = usize::try_from(n) else {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::WouldBlock {
                return Err(UdpError::Recv(e));
            }
            match first {
                Some(_) if last.elapsed() > Duration::from_millis(args.idle_ms) => break,
                None if waiting.elapsed() > Duration::from_millis(args.wait_ms) => {
                    return Err(UdpError::NoneCame(args.wait_ms))
                }
                _ => std::hint::spin_loop(),
            }
            continue;
        };
        last = Instant::now();
        first.get_or_insert(last);
        for (header, payload) in batch.headers[..n].iter().zip(batch.payloads.iter()) {
            if header.msg_len as usize != PAYLOAD {
                continue;
            }
            let mut seq = [0u8; 8];
            seq.copy_from_slice(&payload[..8]);
            let seq = u64::from_le_bytes(seq);
            highest = Some(highest.map_or(seq, |h| h.max(seq)));
            counted += 1;
        }
    }
    let active = first.map_or(0.0, |first| last.duration_since(first).as_secs_f64());
    Ok(json!({
        "probe": "udp-count",
        "ops": counted,
        "fps": if active > 0.0 { counted.saturating_sub(1) as f64 / active } else { 0.0 },
        "active_ms": (active * 1000.0) as u64,
        "lost": highest.map_or(0, |h| (h + 1).saturating_sub(counted)),
        "size": FRAME,
    }))
}
