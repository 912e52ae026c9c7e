//! Host networking for tests: veth pairs and network namespaces of the test's own, each removed
//! when dropped.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Run `ip ARGS` (iproute2, installed by setup); panic if it fails.
pub fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("ip (iproute2) runs");
    assert!(status.success(), "ip {} failed", args.join(" "));
}

/// A name no other interface or namespace of this test run has: `prefix`, the process id and a
/// counter (at most 15 characters, Linux's limit for an interface name, for a short `prefix`).
fn unique(prefix: &str) -> String {
    static MADE: AtomicUsize = AtomicUsize::new(0);
    format!("{prefix}{}x{}", std::process::id(), MADE.fetch_add(1, Ordering::Relaxed))
}

/// A network namespace, deleted when dropped.
pub struct Netns {
    /// Its name, for `ip netns exec NAME`.
    pub name: String,
}

impl Netns {
    /// A new namespace with its loopback up.
    pub fn create() -> Netns {
        let netns = Netns { name: unique("xln") };
        ip(&["netns", "add", &netns.name]);
        ip(&["-n", &netns.name, "link", "set", "lo", "up"]);
        netns
    }

    /// `ip netns exec NAME PROGRAM ...`, to run a program inside.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name, program]);
        command
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// A veth pair, up, without IPv6 (so the host sends nothing of its own through it until told);
/// deleted when dropped.
pub struct Veth {
    /// The end that stays in our namespace.
    pub ours: String,
    /// The other end.
    pub peer: String,
}

impl Veth {
    /// A new pair in our namespace.
    pub fn create() -> Veth {
        let veth = Veth { ours: unique("xla"), peer: unique("xlb") };
        ip(&["link", "add", &veth.ours, "type", "veth", "peer", "name", &veth.peer]);
        for end in [&veth.ours, &veth.peer] {
            std::fs::write(format!("/proc/sys/net/ipv6/conf/{end}/disable_ipv6"), "1")
                .expect("IPv6 turned off on a veth end");
            ip(&["link", "set", end, "up"]);
        }
        veth
    }

    /// Move the peer end into `netns`, with address `cidr` (for example 10.0.0.1/24), up.
    pub fn peer_into(&self, netns: &Netns, cidr: &str) {
        ip(&["link", "set", &self.peer, "netns", &netns.name]);
        ip(&["-n", &netns.name, "addr", "add", cidr, "dev", &self.peer]);
        ip(&["-n", &netns.name, "link", "set", &self.peer, "up"]);
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        // Deleting one end deletes both, wherever the peer is.
        let _ = Command::new("ip").args(["link", "del", &self.ours]).status();
    }
}

/// Wait until the echo responder in network namespace `netns` has bound UDP port 7.
pub fn wait_for_echo(netns: &str) {
    wait_for_udp(netns, 7, "the echo responder");
}

/// Wait until `who`, in network namespace `netns`, has bound UDP `port`.
pub fn wait_for_udp(netns: &str, port: u16, who: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let bound = format!(":{port:04X} ");
    loop {
        let udp = Command::new("ip").args(["netns", "exec", netns, "cat", "/proc/net/udp"]).output().unwrap();
        if String::from_utf8_lossy(&udp.stdout).contains(&bound) {
            return;
        }
        assert!(Instant::now() < deadline, "{who} did not bind UDP port {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Receive one TCP connection's bytes on `address` (IP:PORT) in `netns` into `file`, in the
/// background: python3 there, for as long as the returned child runs (it ends when the sender
/// closes). Each chunk is written as it comes, so `file`'s size says how much arrived.
pub fn receive_tcp(netns: &Netns, address: (&str, u16), file: &std::path::Path) -> std::process::Child {
    let (ip, port) = address;
    let receive = format!(
        r#"
import socket
server = socket.create_server(("{ip}", {port}))
connection, _ = server.accept()
with open("{}", "wb") as out:
    while True:
        data = connection.recv(65536)
        if not data:
            break
        out.write(data)
        out.flush()
"#,
        file.display()
    );
    netns.command("python3").args(["-c", &receive]).spawn().expect("python3 runs")
}

/// A capture, in a namespace, of the first RARP frame (EtherType 0x8035) from one address on one
/// interface: python3 there, listening before [`RarpCapture::start`] returns.
pub struct RarpCapture {
    child: std::process::Child,
    file: std::path::PathBuf,
}

impl RarpCapture {
    /// Listen on `interface` in `netns` for a RARP from `mac` (aa:bb:cc:dd:ee:ff), for at most
    /// `seconds`; the frame goes to `file`.
    pub fn start(
        netns: &Netns,
        interface: &str,
        mac: &str,
        seconds: u32,
        file: &std::path::Path,
    ) -> RarpCapture {
        use std::io::BufRead;
        let capture = format!(
            r#"
import socket
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x8035))
s.bind(("{interface}", 0))
s.settimeout({seconds})
print("ready", flush=True)
mac = bytes.fromhex("{}")
while True:
    frame = s.recv(2048)
    if frame[6:12] == mac:
        open("{}", "w").write(frame.hex())
        break
"#,
            mac.replace(':', ""),
            file.display()
        );
        let mut child = netns
            .command("python3")
            .args(["-c", &capture])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let mut ready = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut ready).unwrap();
        assert_eq!(ready.trim(), "ready", "the RARP capture did not start");
        RarpCapture { child, file: file.to_path_buf() }
    }

    /// The frame, once the capture ended; `None` if none came in time.
    pub fn frame(mut self) -> Option<Vec<u8>> {
        let ended = self.child.wait().ok()?;
        let hex = std::fs::read_to_string(&self.file).ok().filter(|_| ended.success())?;
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok()).collect()
    }

    /// Stop listening.
    pub fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
