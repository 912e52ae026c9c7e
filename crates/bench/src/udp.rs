//! `exitless udp-echo` and `exitless udp-rr`: the host side of the network benchmark, and its
//! bare-metal baseline. The echo responder answers every datagram with itself; the
//! request-response client sends one datagram, waits for its echo, and repeats, like netperf's
//! UDP_RR. The same responder serves the guest (through a tap) and the baseline's client
//! (through a veth pair). With `--packet`, the client goes without the socket layer and the
//! kernel's UDP/IP stack (see [`packet`]). `exitless udp-flood` and `exitless udp-count` are
//! the bare-metal frame rate (see [`frames`]).

mod frames;
mod packet;

pub use frames::{count as frames_count, flood as frames_flood, UdpCountArgs, UdpFloodArgs};

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use serde_json::json;

use clap::Args;
use exitless_args::fail;
use thiserror::Error;

/// Largest datagram either tool handles.
const MAX_DATAGRAM: usize = 65_536;

/// Run `exitless udp-echo`: answer every datagram with itself until `--count` are answered or
/// none came for `--idle-exit-s`; the process's exit status.
pub fn echo(args: UdpEchoArgs) -> i32 {
    let socket = match UdpSocket::bind(args.bind) {
        Ok(s) => s,
        Err(e) => return fail(format_args!("cannot bind {}: {e}", args.bind)),
    };
    if let Some(cpu) = args.cpu {
        if let Err(e) = vmm::pin_current_thread(cpu) {
            return fail(format_args!("cannot pin to CPU {cpu}: {e}"));
        }
    }
    let _ = socket.set_read_timeout(args.idle_exit_s.map(Duration::from_secs_f64));
    let mut buffer = vec![0u8; MAX_DATAGRAM];
    let mut answered = 0u64;
    loop {
        match socket.recv_from(&mut buffer) {
            Ok((n, from)) => {
                if socket.send_to(&buffer[..n], from).is_ok() {
                    answered += 1;
                }
            }
            // The idle timeout: nobody asked for a while.
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                break
            }
            Err(e) => return fail(format_args!("udp-echo: {e}")),
        }
        if args.count.is_some_and(|count| answered >= count) {
            break;
        }
    }
    eprintln!("exitless udp-echo: answered {answered} datagrams");
    0
}

/// Run `exitless udp-rr` and print its JSON result line; the process's exit status.
pub fn rr(args: UdpRrArgs) -> i32 {
    match run_rr(&args) {
        Ok(line) => {
            println!("{line}");
            0
        }
        Err(e) => fail(e),
    }
}

/// Why `exitless udp-rr`, `udp-flood` or `udp-count` stopped.
#[derive(Debug, Error)]
enum UdpError {
    /// `--cpu`: the thread could not be pinned.
    #[error("cannot pin to CPU {cpu}: {source}")]
    Pin {
        cpu: usize,
        #[source]
        source: io::Error,
    },
    /// `--packet` with an IPv6 responder.
    #[error("--packet speaks IPv4 only")]
    PacketIpv4,
    /// `--packet` without the addresses it needs.
    #[error("--packet needs --from, --from-mac and --to-mac")]
    PacketAddresses,
    /// The AF_PACKET client could not start.
    #[error(transparent)]
    Packet(#[from] packet::PacketError),
    /// The UDP socket could not be made.
    #[error("cannot bind {at}: {source}")]
    Bind {
        at: SocketAddr,
        #[source]
        source: io::Error,
    },
    /// The UDP socket could not be connected to its peer.
    #[error("cannot reach {to}: {source}")]
    Connect {
        to: SocketAddr,
        #[source]
        source: io::Error,
    },
    /// The UDP socket's blocking mode or timeout could not be set.
    #[error("cannot set up the UDP socket: {0}")]
    Socket(#[source] io::Error),
    /// A datagram could not be sent.
    #[error("send: {0}")]
    Send(#[source] io::Error),
    /// A datagram could not be received.
    #[error("recv: {0}")]
    Recv(#[source] io::Error),
    /// Too many requests went unanswered.
    #[error("{timeouts} requests to {to} went unanswered")]
    Unanswered { timeouts: u64, to: SocketAddr },
    /// `udp-count`: nobody sent anything.
    #[error("no datagram came in {0} ms")]
    NoneCame(u64),
}

/// Pin this thread to `cpu`, if one is given.
fn pin(cpu: Option<usize>) -> Result<(), UdpError> {
    match cpu {
        Some(cpu) => vmm::pin_current_thread(cpu).map_err(|source| UdpError::Pin { cpu, source }),
        None => Ok(()),
    }
}

/// A UDP socket on any local address of `to`'s family, connected to `to`.
fn connected(to: SocketAddr) -> Result<UdpSocket, UdpError> {
    let local: SocketAddr = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().expect("literal");
    let socket = UdpSocket::bind(local).map_err(|source| UdpError::Bind { at: local, source })?;
    socket.connect(to).map_err(|source| UdpError::Connect { to, source })?;
    Ok(socket)
}

/// How the client sends a request and takes its answer.
trait Transport {
    /// Send `payload` as one datagram to the responder.
    fn send(&mut self, payload: &[u8]) -> io::Result<()>;
    /// The next answer's payload into `buffer` (its length); `WouldBlock` or `TimedOut` when
    /// there is none (yet).
    fn recv(&mut self, buffer: &mut [u8]) -> io::Result<usize>;
}

impl Transport for UdpSocket {
    fn send(&mut self, payload: &[u8]) -> io::Result<()> {
        UdpSocket::send(self, payload).map(drop)
    }

    fn recv(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        UdpSocket::recv(self, buffer)
    }
}

fn run_rr(args: &UdpRrArgs) -> Result<serde_json::Value, UdpError> {
    pin(args.cpu)?;
    if let Some(interface) = &args.packet {
        let SocketAddr::V4(to) = args.to else { return Err(UdpError::PacketIpv4) };
        let (Some(from), Some(from_mac), Some(to_mac)) = (args.from, args.from_mac, args.to_mac) else {
            return Err(UdpError::PacketAddresses);
        };
        let addresses = packet::Addresses { interface: interface.clone(), from, from_mac, to, to_mac };
        let mut client = packet::PacketClient::open(&addresses, args.size as usize)?;
        let mut line = measure(args, &mut client, true)?;
        line["client"] = "af-packet".into();
        line["ignored"] = client.ignored.into();
        return Ok(line);
    }
    let socket = connected(args.to)?;
    if args.busy_poll {
        socket.set_nonblocking(true).map_err(UdpError::Socket)?;
    } else {
        socket.set_read_timeout(Some(Duration::from_millis(args.timeout_ms))).map_err(UdpError::Socket)?;
    }
    let mut socket = socket;
    let mut line = measure(args, &mut socket, args.busy_poll)?;
    line["client"] = "socket".into();
    Ok(line)
}

/// The warm-up and the measured run through `client`, which spins on `recv` when `busy_poll`.
fn measure(
    args: &UdpRrArgs,
    client: &mut impl Transport,
    busy_poll: bool,
) -> Result<serde_json::Value, UdpError> {
    let timeout = Duration::from_millis(args.timeout_ms);
    let mut request = vec![0u8; args.size as usize];
    let mut answer = vec![0u8; MAX_DATAGRAM];
    let mut latencies = Vec::with_capacity(1 << 20);
    let (mut timeouts, mut mismatches, mut sequence) = (0u64, 0u64, 0u64);
    let mut transaction = |latencies: Option<&mut Vec<u64>>| -> Result<(), UdpError> {
        sequence += 1;
        for (i, byte) in request.iter_mut().enumerate() {
            *byte = (sequence as usize + i) as u8;
        }
        let started = Instant::now();
        client.send(&request).map_err(UdpError::Send)?;
        loop {
            match client.recv(&mut answer) {
                Ok(n) if n == request.len() && answer[..n] == request[..] => break,
                Ok(_) => mismatches += 1, // a late answer to an earlier request, or garbage
                // Busy polling: spin on the non-blocking socket until the timeout.
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        && busy_poll
                        && started.elapsed() < timeout =>
                {
                    std::hint::spin_loop()
                }
                Err(e)
                    if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
                {
                    timeouts += 1;
                    if timeouts > args.max_timeouts {
                        return Err(UdpError::Unanswered { timeouts, to: args.to });
                    }
                    return Ok(());
                }
                Err(e) => return Err(UdpError::Recv(e)),
            }
        }
        if let Some(latencies) = latencies {
            latencies.push(started.elapsed().as_nanos() as u64);
        }
        Ok(())
    };
    for _ in 0..args.warmup {
        transaction(None)?;
    }
    let started = Instant::now();
    let deadline = started + Duration::from_millis(args.duration_ms);
    while Instant::now() < deadline {
        transaction(Some(&mut latencies))?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let percentile = |p: f64| {
        latencies.get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
    };
    Ok(json!({
        "probe": "udp-rr-host",
        "ops": latencies.len(),
        "tps": latencies.len() as f64 / elapsed,
        "p50_ns": percentile(0.50),
        "p99_ns": percentile(0.99),
        "max_ns": latencies.last(),
        "size": args.size,
        "timeouts": timeouts,
        "mismatches": mismatches,
        "busy_poll": busy_poll,
    }))
}

/// The command line of `exitless udp-echo`.
#[derive(Args)]
pub struct UdpEchoArgs {
    /// Address and port to answer on.
    #[arg(long, value_name = "ADDR:PORT")]
    pub bind: std::net::SocketAddr,
    /// Stop after answering this many datagrams.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Stop after this many seconds without a datagram.
    #[arg(long, value_name = "SECONDS", value_parser = exitless_args::parse_seconds)]
    pub idle_exit_s: Option<f64>,
    /// Pin to this host CPU.
    #[arg(long, value_name = "CPU")]
    pub cpu: Option<usize>,
}

/// The command line of `exitless udp-rr`.
#[derive(Args)]
pub struct UdpRrArgs {
    /// The echo responder.
    #[arg(long, value_name = "ADDR:PORT")]
    pub to: std::net::SocketAddr,
    /// Datagram payload bytes.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=65_507))]
    pub size: u64,
    /// Measured time, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub duration_ms: u64,
    /// Unmeasured transactions first.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub warmup: u64,
    /// How long to wait for an answer before sending the next request.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub timeout_ms: u64,
    /// Give up after this many unanswered requests.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub max_timeouts: u64,
    /// Spin on a non-blocking socket instead of sleeping in recv (a polling client, like the
    /// exitless guest).
    #[arg(long)]
    pub busy_poll: bool,
    /// Go without the socket layer and the kernel's UDP/IP stack, as the guest does: write
    /// Ethernet frames to an AF_PACKET socket on this interface and busy poll its memory-mapped
    /// receive ring for the echoes. Needs --from, --from-mac and --to-mac, an address the
    /// namespace does not own (the echo then bypasses its IP stack), and a neighbour entry for
    /// it on the responder's side.
    #[arg(long, value_name = "IFACE", requires_all = ["from", "from_mac", "to_mac"])]
    pub packet: Option<String>,
    /// With --packet: the client's IPv4 address and UDP port.
    #[arg(long, value_name = "IP:PORT")]
    pub from: Option<std::net::SocketAddrV4>,
    /// With --packet: the client's MAC address (the requests' source).
    #[arg(long, value_name = "MAC", value_parser = exitless_args::net::parse_mac)]
    pub from_mac: Option<[u8; 6]>,
    /// With --packet: the responder's MAC address (the requests' destination).
    #[arg(long, value_name = "MAC", value_parser = exitless_args::net::parse_mac)]
    pub to_mac: Option<[u8; 6]>,
    /// Pin to this host CPU.
    #[arg(long, value_name = "CPU")]
    pub cpu: Option<usize>,
}
