//! A real tap in a network namespace of the test's own: an ARP request written into the tap is
//! answered by the kernel's stack, and the answer comes back out of the tap.

use std::process::Command;
use std::time::{Duration, Instant};

use super::*;

struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("exl-{tag}-{}", std::process::id());
        let status = Command::new("ip").args(["netns", "add", &name]).status().expect("ip (iproute2)");
        assert!(status.success(), "ip netns add {name}");
        Netns(name)
    }

    fn ip(&self, args: &[&str]) {
        let status = Command::new("ip").args(["-n", &self.0]).args(args).status().unwrap();
        assert!(status.success(), "ip -n {} {args:?}", self.0);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

const OUR_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcc];

fn arp_request(sender_ip: [u8; 4], target_ip: [u8; 4]) -> Vec<u8> {
    let mut frame = vec![0xff; 6];
    frame.extend_from_slice(&OUR_MAC);
    frame.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0x00, 6, 4, 0, 1]);
    frame.extend_from_slice(&OUR_MAC);
    frame.extend_from_slice(&sender_ip);
    frame.extend_from_slice(&[0; 6]);
    frame.extend_from_slice(&target_ip);
    frame
}

#[test]
fn frames_go_both_ways_through_a_tap_in_a_namespace() {
    let netns = Netns::new("tap");
    let tap = Tap::open("exltap0", Some(&netns.0)).unwrap();
    assert_eq!(tap.name(), "exltap0");
    netns.ip(&["addr", "add", "10.77.0.1/24", "dev", "exltap0"]);
    let request = arp_request([10, 77, 0, 2], [10, 77, 0, 1]);
    // SAFETY: writes `request`, which outlives the call, to the tap's open fd.
    let written = unsafe { libc::write(tap.as_raw_fd(), request.as_ptr().cast(), request.len()) };
    assert_eq!(written, request.len() as isize);
    let mut buffer = [0u8; 2048];
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        assert!(Instant::now() < deadline, "no ARP reply from the namespace's stack");
        // SAFETY: reads into `buffer`, which outlives the call, from the tap's open fd.
        let n = unsafe { libc::read(tap.as_raw_fd(), buffer.as_mut_ptr().cast(), buffer.len()) };
        match n {
            // An ARP reply (opcode 2) to our MAC, for 10.77.0.1.
            42.. if buffer[12..14] == [8, 6] && buffer[20..22] == [0, 2] => {
                assert_eq!(&buffer[0..6], &OUR_MAC);
                assert_eq!(&buffer[28..32], &[10, 77, 0, 1]);
                break;
            }
            0.. => {} // IPv6 neighbour discovery and the like
            _ => std::thread::sleep(Duration::from_millis(1)), // EAGAIN: nothing yet
        }
    }
}

#[test]
fn bad_names_and_namespaces_are_clear_errors() {
    assert!(matches!(Tap::open("", None), Err(TapError::BadName(_))));
    assert!(matches!(Tap::open("much-too-long-for-linux", None), Err(TapError::BadName(_))));
    assert!(matches!(Tap::open("a/b", None), Err(TapError::BadName(_))));
    let missing = Tap::open("exltap1", Some("exitless-no-such-netns")).unwrap_err();
    assert!(matches!(missing, TapError::Netns { .. }), "{missing}");
    assert!(missing.to_string().contains("ip netns add"));
}
