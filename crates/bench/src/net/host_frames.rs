//! The bare-metal frame rate in `exitless bench net`: `exitless udp-flood` in the client's
//! namespace sends 60-byte frames over the veth pair to `exitless udp-count` in the server's,
//! on the same two CPUs the VM-to-VM frame rows' sender and IOCore have.

use std::process::{Command, Stdio};

use serde_json::Value;

use super::{Lab, Row, FRAME_LEN, SERVER_VETH_IP};
use crate::args::NetBenchArgs;

/// The row's name.
pub const ROW_NAME: &str = "64 B frames bare metal (veth, UDP sockets: sendmmsg, busy-poll recvmmsg)";
/// The counter's port (the echo responder has 7).
pub(super) const COUNT_PORT: u16 = 9;

/// The row: frames a second from one namespace's socket into the other's.
pub fn row(lab: &Lab, args: &NetBenchArgs) -> Row {
    let mut row = Row::new("host", ROW_NAME.into(), FRAME_LEN as u64);
    row.device = "veth";
    row.workload = "frames";
    if let Err(e) = measure(&mut row, lab, args) {
        row.note = Some(format!("not measured: {}", super::super::one_line(&e)));
    }
    row
}

fn measure(row: &mut Row, lab: &Lab, args: &NetBenchArgs) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let mut counter = Command::new("ip")
        .args(["netns", "exec", &lab.server])
        .arg(&exe)
        .args(["udp-count", "--bind", &format!("{SERVER_VETH_IP}:{COUNT_PORT}")])
        .args(["--cpu", &args.iocore_cpu.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start udp-count: {e}"))?;
    if !lab.server_port_bound(COUNT_PORT) {
        let _ = counter.kill();
        let said = counter.wait_with_output().map(|o| String::from_utf8_lossy(&o.stderr).into_owned());
        return Err(format!("udp-count did not bind its socket: {}", said.unwrap_or_default().trim()));
    }
    let flood = Command::new("ip")
        .args(["netns", "exec", &lab.client])
        .arg(&exe)
        .args(["udp-flood", "--to", &format!("{SERVER_VETH_IP}:{COUNT_PORT}")])
        .args(["--duration-ms", &args.duration_ms.to_string(), "--cpu", &args.vcpu_cpu.to_string()])
        .output();
    // It stops once no datagram came for a while, or after waiting in vain for the first.
    let counted = counter.wait_with_output().map_err(|e| format!("udp-count: {e}"))?;
    let flood = flood.map_err(|e| format!("cannot run udp-flood: {e}"))?;
    let result = |output: &std::process::Output, tool: &str| {
        let stdout = String::from_utf8_lossy(&output.stdout);
        stdout.lines().find_map(|l| serde_json::from_str::<Value>(l).ok()).ok_or_else(|| {
            format!("{tool} printed no result: {}", String::from_utf8_lossy(&output.stderr).trim())
        })
    };
    let (sent, counted) = (result(&flood, "udp-flood")?, result(&counted, "udp-count")?);
    let fps = counted["fps"].as_f64().unwrap_or(0.0);
    row.transactions = counted["ops"].as_u64().unwrap_or(0);
    row.mpps = Some(fps / 1e6);
    row.exits_per_transaction = Some(0.0);
    row.cpu_cores_used = Some(2.0);
    row.note = Some(format!(
        "udp-flood on CPU {} offered {:.3} Mpps ({} frames); udp-count on CPU {} took {:.3} Mpps ({} frames, {} lost). \
         The veth pair hands each frame to the receiving namespace's stack on the sender's CPU; both \
         programs spin",
        args.vcpu_cpu,
        sent["fps"].as_f64().unwrap_or(0.0) / 1e6,
        sent["ops"].as_u64().unwrap_or(0),
        args.iocore_cpu,
        fps / 1e6,
        row.transactions,
        counted["lost"].as_u64().unwrap_or(0),
    ));
    Ok(())
}
