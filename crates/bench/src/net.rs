//! `exitless bench net`: UDP request-response latency through virtio-net and a tap, in each I/O
//! mode, against the same request-response between two host network namespaces over a veth
//! pair, and against QEMU-KVM's virtio-net on the same tap (see [`qemu`]). The echo responder
//! is the same program (`exitless udp-echo`) in every case.

mod fairness;
mod frame_rate;
mod host_frames;
mod qemu;
mod switch;
mod vm_to_vm;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use exitless_args::fail;
use probe_image as probe;
use serde::Serialize;
use serde_json::{Map, Value};
use thiserror::Error;
use vmm::{ConsoleMode, IoMode, NetConfig, VmConfig, VmError};

use super::hosts::{ip, IpError};
use super::machine::About;
use super::plot::{Bar, Kind, PlotError, Units};
use super::table::Table;
use super::{causes_per, format_causes, progress, GuestRunError};
use crate::args::{NetBenchArgs, Peer};
use crate::qemu::CpuOutOfRange;

const RUN_SLACK: Duration = Duration::from_secs(120);
const TAP: &str = "exltap0";
const SERVER_TAP_IP: &str = "10.99.0.1";
const GUEST_IP: &str = "10.99.0.2";
const SERVER_VETH_IP: &str = "10.98.0.1";
const CLIENT_VETH_IP: &str = "10.98.0.2";
/// The responder's veth end's MAC, set so the AF_PACKET client can address it.
const SERVER_VETH_MAC: &str = "02:65:78:6c:00:01";
/// The AF_PACKET client's address: on the client's veth end, but not the namespace's own
/// (the server side has a neighbour entry for it), so the echoes skip the client's IP stack.
const PACKET_CLIENT_IP: &str = "10.98.0.3";
const PACKET_CLIENT_MAC: &str = "02:65:78:6c:00:03";
const PACKET_CLIENT_PORT: u16 = 40000;
/// The far end of `exitless vhost-user-net`'s uplink, in the responder's namespace, and the
/// guest on the daemon's NIC.
const UPLINK_PEER: &str = "exlu0";
const SERVER_UPLINK_IP: &str = "10.97.0.1";
const UPLINK_GUEST_IP: &str = "10.97.0.2";
/// The taps of the VM-to-VM peer, on a bridge in a namespace of their own.
const BRIDGE_TAPS: [&str; 2] = ["exlb0", "exlb1"];
const PORT: u16 = 7;
/// Bytes of each frame in the frame-rate rows, as a 64-byte frame is counted: without its FCS.
const FRAME_LEN: usize = 60;

/// Why the network bench stopped.
#[derive(Debug, Error)]
enum NetError {
    /// The TSC's rate could not be read from KVM.
    #[error(transparent)]
    TscKhz(VmError),
    /// `--plot`: the plot could not be written.
    #[error(transparent)]
    Plot(#[from] PlotError),
    /// The namespaces, the tap or the veth pair could not be set up.
    #[error(transparent)]
    Ip(#[from] IpError),
    /// The path of this executable, which the responder and the clients run, is unknown.
    #[error("cannot find this executable: {0}")]
    CurrentExe(#[source] std::io::Error),
    /// The echo responder could not be started.
    #[error("echo responder: {0}")]
    StartResponder(#[source] std::io::Error),
    /// The echo responder did not bind its socket in time.
    #[error("the echo responder did not start")]
    ResponderNotStarted,
    /// There is no responder to move.
    #[error("no responder")]
    NoResponder,
    /// The responder cannot be moved to that CPU.
    #[error(transparent)]
    Cpu(#[from] CpuOutOfRange),
    /// sched_setaffinity refused to move the responder.
    #[error("cannot move the responder to CPU {cpu}: {source}")]
    MoveResponder {
        cpu: usize,
        #[source]
        source: std::io::Error,
    },
    /// A bare-metal client (`exitless udp-rr`) could not be run.
    #[error("udp-rr: {0}")]
    UdpRr(#[source] std::io::Error),
    /// A bare-metal client printed no result (`stderr`: what it said instead).
    #[error("udp-rr printed no result: {stderr}")]
    NoUdpRrResult { stderr: String },
    /// A guest run in this I/O mode failed.
    #[error("{mode}: {source}")]
    Guest {
        mode: IoMode,
        #[source]
        source: GuestRunError,
    },
    /// `--peers qemu`, and QEMU is not installed.
    #[error("--peers qemu: qemu-system-x86_64 not found (install qemu-system-x86, or pass --peers none)")]
    NoQemu,
    /// The QEMU peer could not be set up.
    #[error(transparent)]
    Qemu(#[from] qemu::QemuNetError),
}

/// The bare-metal clients, all `exitless udp-rr` in the client namespace.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Client {
    /// Kernel UDP socket, sleeping in recv (netperf's way).
    Blocking,
    /// Kernel UDP socket, non-blocking, spinning on recv (the guest's way of waiting).
    BusyPoll,
    /// AF_PACKET, busy polling a receive ring: no socket layer, no UDP/IP stack (the guest's
    /// way of waiting and of building frames).
    Packet,
    /// Kernel UDP socket, sleeping in recv, with the responder moved to the client's CPU for
    /// the run: no request wakes a thread on another CPU (an inter-processor interrupt), as
    /// none does in a guest's run, where the device's thread shares the responder's CPU.
    SameCpu,
}

impl Client {
    const ALL: [Client; 4] = [Client::Blocking, Client::BusyPoll, Client::Packet, Client::SameCpu];

    fn name(self) -> &'static str {
        match self {
            Client::Blocking => "bare metal (veth, blocking client)",
            Client::BusyPoll => "bare metal (veth, busy-poll client)",
            Client::Packet => "bare metal (veth, AF_PACKET busy-poll client)",
            Client::SameCpu => "bare metal (veth, blocking client, responder on its CPU)",
        }
    }
}

#[derive(Serialize, Clone)]
struct Row {
    device: &'static str,
    /// What the transactions crossed: `vm-to-host` (a guest and the host's responder) or
    /// `host-to-host` (bare metal, namespace to namespace).
    path: &'static str,
    vmm: &'static str,
    mode: String,
    workload: &'static str,
    size: u64,
    transactions_per_s: Option<f64>,
    p50_us: Option<f64>,
    p99_us: Option<f64>,
    transactions: u64,
    exits_per_transaction: Option<f64>,
    exits_by_cause: Map<String, Value>,
    bare_metal_transactions_per_s: Option<f64>,
    /// Guest transactions per second over bare metal's (1.0: equal); in a frame-rate row,
    /// frames a second over bare metal's frame rate.
    ratio_to_bare_metal: Option<f64>,
    /// Guest p50 latency over bare metal's (1.0: equal; the papers' latency comparison).
    p50_ratio_to_bare_metal: Option<f64>,
    /// For exitless's rows: transactions (or frames) per second over the best QEMU row's on the
    /// same path and workload (1.0: equal).
    ratio_to_qemu: Option<f64>,
    cpu_cores_used: Option<f64>,
    /// The peer's command line (QEMU's rows).
    command: Option<String>,
    /// VMs at once (the many-VM row; `transactions_per_s` is then their sum).
    vms: Option<usize>,
    per_vm_transactions_per_s: Vec<f64>,
    /// Jain's fairness index of the VMs' rates: (Σx)² / (n·Σx²), 1 when all are equal.
    jain_fairness: Option<f64>,
    /// The VMs' common measured time over their mean measured time.
    window_overlap: Option<f64>,
    /// Millions of frames a second (the frame-rate row; `size` is then the frame's bytes).
    mpps: Option<f64>,
    note: Option<String>,
}

impl Row {
    /// What exitless's own VM's run measured: its `udp-rr` result, exits and cores.
    fn fill(&mut self, run: &super::GuestRun) {
        let ops = run.line["ops"].as_u64().unwrap_or(0);
        self.transactions = ops;
        self.transactions_per_s = run.line["tps"].as_f64();
        self.p50_us = run.line["p50_ns"].as_f64().map(|ns| ns / 1000.0);
        self.p99_us = run.line["p99_ns"].as_f64().map(|ns| ns / 1000.0);
        self.exits_per_transaction = Some(run.counters.get("exits") as f64 / ops.max(1) as f64);
        self.exits_by_cause = causes_per(&run.counters, ops);
        self.cpu_cores_used = run.cores_used;
    }

    /// What the row's ratios compare: frames a second (in millions) for a frame-rate row,
    /// transactions a second otherwise.
    fn rate(&self) -> Option<f64> {
        match self.workload {
            "frames" => self.mpps,
            _ => self.transactions_per_s,
        }
    }

    /// A row of `vmm` in `mode`, nothing measured yet.
    fn new(vmm: &'static str, mode: String, size: u64) -> Row {
        Row {
            device: "virtio-net",
            path: if vmm == "host" { "host-to-host" } else { "vm-to-host" },
            vmm,
            mode,
            workload: "udp-rr",
            size,
            transactions_per_s: None,
            p50_us: None,
            p99_us: None,
            transactions: 0,
            exits_per_transaction: None,
            exits_by_cause: Map::new(),
            bare_metal_transactions_per_s: None,
            ratio_to_bare_metal: None,
            p50_ratio_to_bare_metal: None,
            ratio_to_qemu: None,
            cpu_cores_used: None,
            command: None,
            vms: None,
            per_vm_transactions_per_s: Vec::new(),
            jain_fairness: None,
            window_overlap: None,
            mpps: None,
            note: None,
        }
    }
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    about: About,
    network: String,
    /// QEMU's version line, when it was a peer.
    qemu: Option<String>,
    /// What the bare-metal rows are, and why a guest can beat them.
    bare_metal: String,
    results: Vec<Row>,
}

/// What the bare-metal rows measure, and why a guest can beat them, for the table's notes and
/// the JSON report.
const BARE_METAL: &str =
    "bare metal is `exitless udp-rr` in a network namespace of its own, pinned to the vCPU's \
     core, to the same responder over a veth pair: on kernel UDP sockets sleeping in recv or busy \
     polling; on AF_PACKET (`--packet`: raw frames, busy polling a mapped receive ring, no socket layer \
     or UDP/IP stack in the client, as in the guest); and sleeping in recv with the responder moved to \
     its core. Ratios are against the client with the lowest p50. A guest in exitless's polling modes can \
     beat the first three because nothing in its transaction wakes a thread on another CPU: its IOCore, \
     which writes the tap, spins on the responder's CPU, so the responder wakes locally, on a CPU that \
     never idles. Those clients wake the responder on the other, idle CPU each time (an inter-processor interrupt, which on a host that is itself a \
     VM means waking a halted vCPU); the last client is bare metal without that cost";

pub fn main(args: NetBenchArgs) -> i32 {
    match run(&args) {
        Ok(report) => super::print_report(&report, args.output, |markdown| report.table(markdown)),
        Err(e) => fail(e),
    }
}

fn run(args: &NetBenchArgs) -> Result<Report, NetError> {
    let tsc_khz = vmm::tsc_khz().map_err(NetError::TscKhz)?;
    if let Some(dir) = &args.plot {
        super::plot::prepare(dir)?;
    }
    progress(format_args!("setting up namespaces, a tap, a veth pair and the echo responder"));
    let lab = Lab::new(args)?;
    let mut results = Vec::new();
    let bare_metal = if args.no_baseline {
        None
    } else {
        // Clients on kernel sockets that sleep in recv and that poll, and one without the
        // socket layer: the one with the lowest p50 is the baseline.
        let mut best: Option<Row> = None;
        for client in Client::ALL {
            progress(format_args!("{}: UDP request-response over veth, {} B", client.name(), args.size));
            let row = lab.baseline(args, client)?;
            if best.as_ref().is_none_or(|b| row.p50_us < b.p50_us) {
                best = Some(row.clone());
            }
            results.push(row);
        }
        for row in results.iter_mut() {
            row.ratio_to_bare_metal =
                best.as_ref().and_then(|b| Some(row.transactions_per_s? / b.transactions_per_s?));
            row.p50_ratio_to_bare_metal = best.as_ref().and_then(|b| Some(row.p50_us? / b.p50_us?));
        }
        best
    };
    // Frames over the same veth pair: what the frame-rate rows are against.
    let bare_metal_frames = match args.no_baseline {
        true => None,
        false => {
            progress(format_args!("{}: as many as one namespace sends the other", host_frames::ROW_NAME));
            let row = host_frames::row(&lab, args);
            results.push(row.clone());
            Some(row)
        }
    };
    // QEMU first looked for, so that a missing QEMU stops the bench before it measures.
    let qemu = match args.peers.contains(&Peer::Qemu) {
        true => Some(qemu::QemuNet::new(crate::qemu::Qemu::find().ok_or(NetError::NoQemu)?)?),
        false => None,
    };
    let mut guests = Vec::new();
    for &mode in &args.modes {
        let mode = IoMode::from(mode);
        progress(format_args!("exitless {mode}: UDP request-response through the tap, {} B", args.size));
        guests.push(lab.guest(mode, args, tsc_khz).map_err(|source| NetError::Guest { mode, source })?);
    }
    for &mode in &args.daemon_modes {
        progress(format_args!(
            "{}: UDP request-response through the switch and uplink",
            switch::exitless_row_name(mode)
        ));
        guests.push(switch::exitless_row(&lab, args, tsc_khz, mode));
    }
    if args.fairness_vms >= 2 {
        let vms = usize::from(args.fairness_vms);
        progress(format_args!(
            "{}: UDP request-response through the switch and uplink",
            fairness::row_name(vms)
        ));
        guests.push(fairness::row(&lab, args, tsc_khz, vms));
    }
    progress(format_args!("{}: 64 B frames, as many as one IOCore moves", frame_rate::ROW_NAME));
    guests.push(frame_rate::row(args));
    progress(format_args!("{}: 64 B frames, as many as one VM sends the other", frame_rate::VM_ROW_NAME));
    guests.push(frame_rate::vm_row(args, tsc_khz, vm_to_vm::responder_cpu(args)));
    let mut peers = qemu.as_ref().map(|q| q.rows(args, &lab, tsc_khz)).unwrap_or_default();
    if let Some(qemu) = &qemu {
        peers.extend(vm_to_vm::rows(qemu, args, &lab, tsc_khz, vm_to_vm::Workload::UdpRr));
        peers.extend(vm_to_vm::rows(qemu, args, &lab, tsc_khz, vm_to_vm::Workload::Frames));
    }
    // "x QEMU": against the QEMU configuration with the highest rate on the same path and
    // workload (QEMU's own backends, not QEMU on exitless's daemon).
    let best_peer = |row: &Row| {
        peers
            .iter()
            .filter(|r| r.vmm == "qemu" && r.path == row.path && r.workload == row.workload)
            .filter_map(Row::rate)
            .reduce(f64::max)
    };
    let best: Vec<Option<f64>> = guests.iter().chain(&peers).map(best_peer).collect();
    for (row, best) in guests.iter_mut().chain(peers.iter_mut()).zip(best) {
        // Not the many-VM row: its rate is a sum over VMs, the others' one VM's.
        if row.vmm != "qemu" && row.vms.is_none() {
            row.ratio_to_qemu = row.rate().zip(best).map(|(g, q)| g / q);
        }
    }
    for mut row in guests.into_iter().chain(peers) {
        if row.workload == "frames" {
            // VM to VM only: the NIC-to-NIC row runs no guest and no stack, so a ratio to
            // sockets over veth would say little.
            if let Some(host) = bare_metal_frames.as_ref().filter(|_| row.path == "vm-to-vm") {
                row.ratio_to_bare_metal = row.mpps.zip(host.mpps).map(|(g, h)| g / h);
            }
        } else if let Some(host) = bare_metal.as_ref().filter(|_| row.vms.is_none()) {
            // Not the many-VM row (a sum over VMs). Ratios are against the better of the two
            // bare-metal clients (lower p50).
            row.bare_metal_transactions_per_s = host.transactions_per_s;
            row.ratio_to_bare_metal = row.transactions_per_s.zip(host.transactions_per_s).map(|(g, h)| g / h);
            row.p50_ratio_to_bare_metal = row.p50_us.zip(host.p50_us).map(|(g, h)| g / h);
        }
        results.push(row);
    }
    if let Some(dir) = &args.plot {
        let path = plot(dir, &results, args.size)?;
        progress(format_args!("wrote the plot {}", path.display()));
    }
    Ok(Report {
        about: About::now("net"),
        network: format!(
            "guest {GUEST_IP} -> tap {TAP} -> {SERVER_TAP_IP}:{PORT}; QEMU on exitless vhost-user-net: guest \
             {UPLINK_GUEST_IP} -> the daemon's switch -> uplink veth -> {SERVER_UPLINK_IP}:{PORT}; VM to VM: \
             client 10.96.0.2 -> the daemon's switch, or tap, bridge, tap -> guest `udp-echo` 10.96.0.1:{PORT}; bare metal \
             {CLIENT_VETH_IP} -> veth -> {SERVER_VETH_IP}:{PORT}; responder `exitless udp-echo` in its own \
             network namespace; 64 B frames: one NIC's transmit ring -> the switch on one IOCore -> another \
             NIC's receive ring, in this process; VM 10.95.0.2 -> the daemon's switch -> VM 10.95.0.1; QEMU \
             guest 10.96.0.2 -> the daemon's switch, or tap, bridge, tap -> guest 10.96.0.1:{PORT}; bare \
             metal `exitless udp-flood` {CLIENT_VETH_IP} -> veth -> `exitless udp-count` {SERVER_VETH_IP}:{}",
            host_frames::COUNT_PORT
        ),
        qemu: qemu.as_ref().map(|q| q.version().to_string()),
        bare_metal: BARE_METAL.into(),
        results,
    })
}

/// Draw `rows` into `dir`: the bare-metal client with the lower p50 (the one the ratios are
/// against) is bare metal; the other is another host row; the QEMU row with the most
/// transactions per second is the best peer.
fn plot(dir: &std::path::Path, rows: &[Row], size: u64) -> Result<std::path::PathBuf, PlotError> {
    let best_p50 = rows.iter().filter(|r| r.vmm == "host").filter_map(|r| r.p50_us).reduce(f64::min);
    let best_peer =
        rows.iter().filter(|r| r.vmm == "qemu").filter_map(|r| r.transactions_per_s).reduce(f64::max);
    let bars: Vec<Bar> = rows
        .iter()
        .filter(|r| r.workload == "udp-rr")
        .map(|r| Bar {
            label: match r.vmm {
                // Their mode names say what they are.
                "host" | "qemu" | "qemu+exitless" => r.mode.clone(),
                vmm => format!("{vmm} {}", r.mode),
            },
            kind: match r.vmm {
                "host" if r.p50_us.is_some() && r.p50_us == best_p50 => Kind::BareMetal,
                "host" => Kind::Host,
                "qemu" if r.transactions_per_s.is_some() && r.transactions_per_s == best_peer => {
                    Kind::BestPeer
                }
                "qemu" => Kind::Peer,
                _ => Kind::Exitless,
            },
            rate: r.transactions_per_s,
            p50_us: r.p50_us,
            p99_us: r.p99_us,
            exits_per_op: r.exits_per_transaction,
            exits_by_cause: &r.exits_by_cause,
        })
        .collect();
    let path = dir.join(format!("net-udp-rr-{size}b.svg"));
    let title = format!("net: UDP request-response, {size} B, through virtio-net and a tap");
    super::plot::write(&path, &title, &bars, &Units::NET)?;
    Ok(path)
}

/// Two network namespaces of our own: the server's, with a tap for the guest and one end of a
/// veth pair, and the bare-metal client's, with the other end. Removed when dropped.
struct Lab {
    server: String,
    client: String,
    /// Our end of the veth pair whose other end (`UPLINK_PEER`) is in the server's namespace:
    /// the uplink of `exitless vhost-user-net`.
    uplink: String,
    /// The namespace of the VM-to-VM peer's bridge and its two taps.
    bridge: String,
    responder: Option<Child>,
}

impl Lab {
    fn new(args: &NetBenchArgs) -> Result<Lab, NetError> {
        let id = std::process::id();
        let mut lab = Lab {
            server: format!("exl-srv-{id}"),
            client: format!("exl-cli-{id}"),
            uplink: format!("exlu{id}"),
            bridge: format!("exl-br-{id}"),
            responder: None,
        };
        let (server, client) = (lab.server.clone(), lab.client.clone());
        ip(&["netns", "add", &server])?;
        ip(&["netns", "add", &client])?;
        for ns in [&server, &client] {
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        ip(&["-n", &server, "tuntap", "add", "dev", TAP, "mode", "tap"])?;
        ip(&["-n", &server, "addr", "add", &format!("{SERVER_TAP_IP}/24"), "dev", TAP])?;
        ip(&["-n", &server, "link", "set", TAP, "up"])?;
        ip(&[
            "link", "add", "exlv0", "netns", &server, "type", "veth", "peer", "name", "exlv1", "netns",
            &client,
        ])?;
        ip(&["-n", &server, "addr", "add", &format!("{SERVER_VETH_IP}/24"), "dev", "exlv0"])?;
        ip(&["-n", &client, "addr", "add", &format!("{CLIENT_VETH_IP}/24"), "dev", "exlv1"])?;
        ip(&["-n", &server, "link", "set", "exlv0", "address", SERVER_VETH_MAC])?;
        ip(&[
            "-n",
            &server,
            "neigh",
            "add",
            PACKET_CLIENT_IP,
            "lladdr",
            PACKET_CLIENT_MAC,
            "dev",
            "exlv0",
            "nud",
            "permanent",
        ])?;
        ip(&["-n", &server, "link", "set", "exlv0", "up"])?;
        ip(&["-n", &client, "link", "set", "exlv1", "up"])?;
        // Deleted with the server's namespace, which holds its other end.
        ip(&["link", "add", &lab.uplink, "type", "veth", "peer", "name", UPLINK_PEER, "netns", &server])?;
        ip(&["-n", &server, "addr", "add", &format!("{SERVER_UPLINK_IP}/24"), "dev", UPLINK_PEER])?;
        ip(&["-n", &server, "link", "set", UPLINK_PEER, "up"])?;
        ip(&["link", "set", &lab.uplink, "up"])?;
        let bridge = lab.bridge.clone();
        ip(&["netns", "add", &bridge])?;
        ip(&["-n", &bridge, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &bridge, "link", "set", "br0", "up"])?;
        for tap in BRIDGE_TAPS {
            ip(&["-n", &bridge, "tuntap", "add", "dev", tap, "mode", "tap"])?;
            ip(&["-n", &bridge, "link", "set", tap, "master", "br0"])?;
            ip(&["-n", &bridge, "link", "set", tap, "up"])?;
        }
        let exe = std::env::current_exe().map_err(NetError::CurrentExe)?;
        let mut responder = Command::new("ip");
        responder.args(["netns", "exec", &server]).arg(&exe).args([
            "udp-echo",
            "--bind",
            &format!("0.0.0.0:{PORT}"),
        ]);
        responder.args(["--cpu", &args.responder_cpu.unwrap_or(args.iocore_cpu).to_string()]);
        lab.responder = Some(
            responder.stdin(Stdio::null()).stderr(Stdio::null()).spawn().map_err(NetError::StartResponder)?,
        );
        lab.wait_for_responder()?;
        Ok(lab)
    }

    /// Wait until the responder's socket is bound.
    fn wait_for_responder(&self) -> Result<(), NetError> {
        match self.server_port_bound(PORT) {
            true => Ok(()),
            false => Err(NetError::ResponderNotStarted),
        }
    }

    /// Whether a socket in the server's namespace is bound to UDP `port` within 10 s (it shows
    /// in the namespace's /proc/net/udp).
    fn server_port_bound(&self, port: u16) -> bool {
        let port = format!(":{port:04X} ");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            let output =
                Command::new("ip").args(["netns", "exec", &self.server, "cat", "/proc/net/udp"]).output();
            if output.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l.contains(&port))) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    fn baseline(&self, args: &NetBenchArgs, client: Client) -> Result<Row, NetError> {
        let exe = std::env::current_exe().map_err(NetError::CurrentExe)?;
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.client])
            .arg(&exe)
            .args(["udp-rr", "--to", &format!("{SERVER_VETH_IP}:{PORT}"), "--size", &args.size.to_string()])
            .args(["--duration-ms", &args.duration_ms.to_string(), "--cpu", &args.vcpu_cpu.to_string()]);
        let responder_cpu = args.responder_cpu.unwrap_or(args.iocore_cpu);
        match client {
            Client::Blocking => {}
            Client::SameCpu => self.move_responder(args.vcpu_cpu)?,
            Client::BusyPoll => {
                command.arg("--busy-poll");
            }
            Client::Packet => {
                command.args([
                    "--packet",
                    "exlv1",
                    "--from",
                    &format!("{PACKET_CLIENT_IP}:{PACKET_CLIENT_PORT}"),
                ]);
                command.args(["--from-mac", PACKET_CLIENT_MAC, "--to-mac", SERVER_VETH_MAC]);
            }
        }
        let output = command.output().map_err(NetError::UdpRr);
        if client == Client::SameCpu {
            self.move_responder(responder_cpu)?;
        }
        let output = output?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let line: Value = stdout.lines().find_map(|l| serde_json::from_str(l).ok()).ok_or_else(|| {
            NetError::NoUdpRrResult { stderr: String::from_utf8_lossy(&output.stderr).trim().to_string() }
        })?;
        let tps = line["tps"].as_f64();
        let mut row = Row::new("host", client.name().into(), args.size);
        row.device = "veth";
        row.transactions_per_s = tps;
        row.p50_us = line["p50_ns"].as_f64().map(|ns| ns / 1000.0);
        row.p99_us = line["p99_ns"].as_f64().map(|ns| ns / 1000.0);
        row.transactions = line["ops"].as_u64().unwrap_or(0);
        row.exits_per_transaction = Some(0.0);
        row.bare_metal_transactions_per_s = tps;
        row.note = Some(match client {
            Client::SameCpu => "client and responder both on the vCPU's core".into(),
            _ => "client pinned to the vCPU's core; the responder as in the guest runs".into(),
        });
        Ok(row)
    }

    /// Pin the responder (one thread; `ip netns exec` became it) to `cpu`.
    fn move_responder(&self, cpu: usize) -> Result<(), NetError> {
        let pid = self.responder.as_ref().ok_or(NetError::NoResponder)?.id();
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(CpuOutOfRange(cpu).into());
        }
        // SAFETY: cpu_set_t is plain old data; all-zero is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `cpu` is below CPU_SETSIZE (checked above), so CPU_SET stays inside `set`, a
        // valid cpu_set_t of the size passed, which sched_setaffinity only reads.
        let done = unsafe {
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(pid as libc::pid_t, std::mem::size_of::<libc::cpu_set_t>(), &set)
        };
        if done != 0 {
            return Err(NetError::MoveResponder { cpu, source: std::io::Error::last_os_error() });
        }
        Ok(())
    }

    fn guest(&self, mode: IoMode, args: &NetBenchArgs, tsc_khz: u32) -> Result<Row, GuestRunError> {
        let cmdline = format!(
            "probe.workload=udp-rr probe.ip={GUEST_IP} probe.dst={SERVER_TAP_IP} probe.port={PORT} probe.size={} \
             probe.duration_ms={} probe.warmup={} probe.tsc_khz={tsc_khz}",
            args.size, args.duration_ms, args.warmup
        );
        let config = VmConfig {
            cmdline: probe::with_io_mode(&cmdline, mode),
            // The probe guest: its exit marks and ping-pong are the test device's.
            testdev: true,
            console: ConsoleMode::Capture,
            timeout: Some(Duration::from_millis(args.duration_ms) + RUN_SLACK),
            pin_vcpus: vec![args.vcpu_cpu],
            nets: vec![NetConfig {
                tap: TAP.into(),
                netns: Some(self.server.clone()),
                mac: NetConfig::default_mac(0),
            }],
            io_mode: mode,
            iocore_cpu: Some(args.iocore_cpu),
            seccomp: args.seccomp.mode(),
            ..Default::default()
        };
        let mut row = Row::new("exitless", mode.name().into(), args.size);
        let run = match super::run_guest(&config, "udp-rr") {
            Ok(run) => run,
            Err(GuestRunError::Vm(e @ VmError::PvEoiUnavailable(_))) => {
                row.note = Some(format!("not measured: {e}"));
                return Ok(row);
            }
            Err(e) => return Err(e),
        };
        row.fill(&run);
        Ok(row)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(mut responder) = self.responder.take() {
            let _ = responder.kill();
            let _ = responder.wait();
        }
        for ns in [&self.server, &self.client, &self.bridge] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

impl Report {
    /// The request-response table, then the frame-rate table.
    fn table(&self, markdown: bool) -> String {
        let (frames, transactions): (Vec<&Row>, Vec<&Row>) =
            self.results.iter().partition(|r| r.workload == "frames");
        let mut out = self.transactions_table(&transactions, markdown);
        if !frames.is_empty() {
            out += &self.frames_table(&frames, markdown);
        }
        out
    }

    /// The context lines of either table: only the machine on a terminal.
    fn context(&self, markdown: bool) -> Vec<(String, String)> {
        let mut context = self.about.context();
        context.push(("network".to_string(), self.network.clone()));
        if let Some(qemu) = &self.qemu {
            context.push(("QEMU".to_string(), qemu.clone()));
        }
        if !markdown {
            context.retain(|(k, _)| k == "machine");
        }
        context
    }

    /// Each row's note; and in Markdown each peer's command line, to go last.
    fn notes(rows: &[&Row], markdown: bool) -> (Vec<String>, Vec<String>) {
        let notes = rows.iter().filter_map(|r| r.note.as_ref().map(|n| format!("{}: {n}", r.mode))).collect();
        let commands = match markdown {
            true => {
                rows.iter().filter_map(|r| r.command.as_ref().map(|c| format!("{}: `{c}`", r.mode))).collect()
            }
            false => Vec::new(),
        };
        (notes, commands)
    }

    fn transactions_table(&self, rows: &[&Row], markdown: bool) -> String {
        let header = vec![
            "mode",
            "transactions/s",
            "p50 µs",
            "p99 µs",
            "exits/transaction",
            "exit causes per transaction",
            "% of bare-metal rate",
            "p50 / bare metal",
            "x QEMU",
            "cores",
        ];
        let cells = rows
            .iter()
            .map(|r| {
                vec![
                    r.mode.clone(),
                    number(r.transactions_per_s, 0),
                    number(r.p50_us, 1),
                    number(r.p99_us, 1),
                    number(r.exits_per_transaction, 3),
                    format_causes(&r.exits_by_cause),
                    number(r.ratio_to_bare_metal.map(|x| x * 100.0), 1),
                    number(r.p50_ratio_to_bare_metal, 2),
                    number(r.ratio_to_qemu, 2),
                    number(r.cpu_cores_used, 2),
                ]
            })
            .collect();
        let (mut notes, commands) = Self::notes(rows, markdown);
        if rows.iter().any(|r| r.vmm == "host") {
            notes.push(format!("{}.", self.bare_metal));
        }
        if rows.iter().any(|r| r.vmm == "qemu") {
            notes.push(
                "x QEMU: an exitless row's transactions/s over the best QEMU row's (same guest, tap and \
                 responder; QEMU's own backends only). The row of QEMU on exitless vhost-user-net reaches \
                 the responder through the daemon's switch and its uplink, a veth pair, not through the tap; \
                 its cores include the daemon's."
                    .into(),
            );
        }
        notes.extend(commands);
        let size = rows.first().map_or(0, |r| r.size);
        let peers = if self.qemu.is_some() { " and QEMU-KVM" } else { "" };
        let title = format!(
            "net: UDP request-response, {size} B, exitless's I/O modes against bare metal (veth){peers}"
        );
        Table { title, context: self.context(markdown), header, rows: cells, notes }.render(markdown)
    }

    fn frames_table(&self, rows: &[&Row], markdown: bool) -> String {
        let header = vec![
            "mode",
            "path",
            "Mpps",
            "exits/frame",
            "exit causes per frame",
            "x bare metal",
            "x QEMU",
            "cores",
        ];
        let cells = rows
            .iter()
            .map(|r| {
                vec![
                    r.mode.clone(),
                    r.path.to_string(),
                    number(r.mpps, 3),
                    number(r.exits_per_transaction, 3),
                    format_causes(&r.exits_by_cause),
                    number(r.ratio_to_bare_metal, 2),
                    number(r.ratio_to_qemu, 2),
                    number(r.cpu_cores_used, 2),
                ]
            })
            .collect();
        let (mut notes, commands) = Self::notes(rows, markdown);
        notes.push(
            "x bare metal (VM-to-VM rows): frames a second over the bare-metal row's (UDP sockets over the veth \
             pair, on the vCPU's and the IOCore's CPUs). x QEMU: over the best QEMU row's on the same path (two \
             QEMUs on taps and a bridge)."
                .into(),
        );
        notes.extend(commands);
        let title =
            "net: 64 B frames (60 bytes without the FCS), one side sending as fast as it can, the other counting".to_string();
        Table { title, context: self.context(markdown), header, rows: cells, notes }.render(markdown)
    }
}

/// `v` with `digits` decimals, or n/a.
fn number(v: Option<f64>, digits: usize) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.digits$}"))
}
