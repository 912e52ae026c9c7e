//! The switch: frames from hostile drivers' transmit rings (headers and Ethernet frames over
//! 1-3 descriptors, to each other's addresses, to broadcast, to nobody, to themselves, from
//! addresses not theirs; headers of any bytes, or asking for a checksum or a TCP super-frame
//! over frames that may or may not be TCP) into hostile drivers' receive rings, two or three
//! guests on one switch or on two (a daemon's two IOCores, frames crossing between them), some
//! isolated, each taking its own offloads. While a port's rings are
//! not broken, each ring's used index counts exactly the chains the switch took from it; no port
//! receives more frames than the others sent (unless the switch cut super-frames), and an
//! isolated one (there is no uplink) none.
#![no_main]

use std::sync::atomic::Ordering;
use std::sync::Arc;

use arbitrary::{Result, Unstructured};
use exitless_fuzz::{address, queue_config, signals, DriverRing, MAX_STEPS, REGION_A, REGION_B};
use libfuzzer_sys::fuzz_target;
use switch::offload::{Segmentation, MIN_MSS};
use switch::{
    MacAddr, NetHeader, Offloads, Port, PortPolicy, QueuePair, Switch, SwitchControl, MAX_FRAME_LEN,
    NET_HDR_LEN,
};
use virtqueue::queue::{Queue, VIRTQ_DESC_F_WRITE};
use virtqueue::QueueWorker;
use vm_memory::{GuestAddress, GuestMemoryMmap};

/// One guest on the switch: its memory, its driver's rings and reset flags, its port.
struct Guest {
    mem: GuestMemoryMmap,
    rx: DriverRing,
    tx: DriverRing,
    broken: [Arc<std::sync::atomic::AtomicBool>; 2],
    port: usize,
    mac: MacAddr,
    isolated: bool,
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});

fn run(u: &mut Unstructured) -> Result<()> {
    let control =
        Arc::new(SwitchControl::with_switches(u.int_in_range(1..=2)?).expect("the switches' mailboxes"));
    let mut switches: Vec<Switch> = (0..control.switches())
        .map(|index| Switch::new(control.clone(), index).expect("a switch's epoll instance"))
        .collect();
    for switch in &mut switches {
        switch.set_polling(u.arbitrary()?);
    }
    let mut guests = Vec::new();
    for i in 0..u.int_in_range(2..=3u8)? {
        // A memory of its own (the harness's `guest_memory` is one per thread): each guest's
        // rings and buffers are where its driver put them, out of the others' reach.
        let mem = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(REGION_A.0), REGION_A.1),
            (GuestAddress(REGION_B.0), REGION_B.1),
        ])
        .expect("mapping a guest's memory");
        let event_idx = u.arbitrary()?;
        let (rx_config, rx_laid_out) = queue_config(u, 0)?;
        let (tx_config, tx_laid_out) = queue_config(u, 1)?;
        let (Ok(rx), Ok(tx)) =
            (Queue::new(&mem, rx_config, event_idx), Queue::new(&mem, tx_config, event_idx))
        else {
            return Ok(());
        };
        let ((rx_signals, rx_broken), (tx_signals, tx_broken)) = (signals(), signals());
        let mac = MacAddr([0x52, 0x54, 0, 0, 0, i + 1]);
        let isolated = u.ratio(1, 3)?;
        let policy = PortPolicy {
            mac: u.arbitrary::<bool>()?.then_some(mac),
            isolated_to: isolated.then_some(mac),
            ..PortPolicy::default()
        };
        let offloads = Offloads {
            checksum: u.arbitrary()?,
            tso4: u.arbitrary()?,
            tso6: u.arbitrary()?,
            merged_buffers: u.arbitrary()?,
        };
        let port = Port::new(QueuePair { rx, tx, rx_signals, tx_signals, tx_kick: None })
            .with_policy(policy)
            .with_offloads(offloads);
        let port = control.attach(port).expect("a free port");
        guests.push(Guest {
            mem,
            rx: DriverRing::new(rx_config, rx_laid_out),
            tx: DriverRing::new(tx_config, tx_laid_out),
            broken: [rx_broken, tx_broken],
            port,
            mac,
            isolated,
        });
    }
    // Each switch takes its ports on its first pass.
    for switch in &mut switches {
        switch.poll();
    }
    let macs: Vec<MacAddr> = guests.iter().map(|g| g.mac).collect();
    for _ in 0..MAX_STEPS {
        if u.is_empty() {
            break;
        }
        let g = u.choose_index(guests.len())?;
        let guest = &mut guests[g];
        match u.int_in_range(0..=9)? {
            0 => guest.rx.driver_step(u, &guest.mem)?,
            1 => guest.tx.driver_step(u, &guest.mem)?,
            2 | 3 => guest.rx.net_receive_chain(u, &guest.mem)?,
            4..=6 => post_transmit_chain(u, &guest.mem, &mut guest.tx, guest.mac, &macs)?,
            7 => {
                let which = u.choose_index(switches.len())?;
                switches[which].set_polling(u.arbitrary()?);
            }
            _ => {
                let which = u.choose_index(switches.len())?;
                switches[which].poll();
                check(&control, &switches, &guests);
            }
        }
    }
    Ok(())
}

/// A transmit chain: a header and a frame from `own` to one of `macs`, broadcast, or anyone,
/// over 1-3 buffers.
fn post_transmit_chain(
    u: &mut Unstructured,
    mem: &GuestMemoryMmap,
    ring: &mut DriverRing,
    own: MacAddr,
    macs: &[MacAddr],
) -> Result<()> {
    let len = NET_HDR_LEN
        + match u.int_in_range(0..=7)? {
            0 => u.int_in_range(0..=16)?,
            1 => u.int_in_range(MAX_FRAME_LEN - 2..=MAX_FRAME_LEN + 2)?,
            2 => u.int_in_range(MAX_FRAME_LEN..=4 * MAX_FRAME_LEN)?,
            _ => u.int_in_range(14..=256)?,
        };
    let destination = match u.int_in_range(0..=5)? {
        0 => MacAddr::BROADCAST,
        1 => MacAddr(u.arbitrary()?),
        2 => own,
        _ => macs[u.choose_index(macs.len())?],
    };
    let source = if u.ratio(1, 8)? { MacAddr(u.arbitrary()?) } else { own };
    let mut bytes = vec![0u8; len];
    u.fill_buffer(&mut bytes)?;
    if len >= NET_HDR_LEN + 12 {
        bytes[NET_HDR_LEN..NET_HDR_LEN + 6].copy_from_slice(&destination.0);
        bytes[NET_HDR_LEN + 6..NET_HDR_LEN + 12].copy_from_slice(&source.0);
    }
    // The header: its bytes as they came, or one a driver with offloads sends, over a frame
    // made to look like TCP (most of the time) or not.
    let header = match u.int_in_range(0..=3)? {
        0 => None,
        1 => Some(NetHeader::default()),
        2 => Some(NetHeader { checksum: Some((u.arbitrary()?, u.arbitrary()?)), segmentation: None }),
        _ => {
            let mss = if u.ratio(1, 8)? { u.arbitrary()? } else { u.int_in_range(MIN_MSS..=1460)? };
            let ipv6 = u.arbitrary()?;
            if u.ratio(3, 4)? {
                tcp_headers(&mut bytes[NET_HDR_LEN..], ipv6);
            }
            let segmentation = if ipv6 { Segmentation::Tcp6 { mss } } else { Segmentation::Tcp4 { mss } };
            let checksum = (if ipv6 { 54 } else { 34 }, 16);
            Some(NetHeader { checksum: Some(checksum), segmentation: Some(segmentation) })
        }
    };
    if let Some(header) = header {
        let num_buffers = u.arbitrary()?;
        bytes[..NET_HDR_LEN].copy_from_slice(&header.to_bytes(num_buffers)[..NET_HDR_LEN.min(len)]);
    }
    let count = u.int_in_range(1..=3)?;
    let mut parts = [(0, 0, 0); 3];
    let mut at = 0;
    for (i, part) in parts[..count].iter_mut().enumerate() {
        let piece = if i + 1 == count { len - at } else { u.int_in_range(0..=len - at)? };
        let addr = address(u)?;
        ring.write(mem, addr, &bytes[at..at + piece]);
        at += piece;
        let flags = if u.ratio(1, 16)? { VIRTQ_DESC_F_WRITE } else { 0 };
        *part = (addr, piece as u32, flags);
    }
    ring.chain(u, mem, &parts[..count])
}

/// Make `frame` (after its addresses) an IPv4 or IPv6 TCP packet's headers, as far as it goes.
fn tcp_headers(frame: &mut [u8], ipv6: bool) {
    let mut put = |at: usize, value: &[u8]| {
        if let Some(into) = frame.get_mut(at..at + value.len()) {
            into.copy_from_slice(value);
        }
    };
    match ipv6 {
        true => {
            put(12, &[0x86, 0xdd, 0x60]);
            put(20, &[6]);
            put(66, &[0x50]);
        }
        false => {
            put(12, &[0x08, 0x00, 0x45]);
            put(23, &[6]);
            put(46, &[0x50]);
        }
    }
}

/// While a port's rings are not broken (and laid out apart, so the used index is the switch's
/// alone), each used index counts the chains taken; no port got more frames than were sent.
fn check(control: &SwitchControl, switches: &[Switch], guests: &[Guest]) {
    let counters: Vec<_> = guests
        .iter()
        .map(|g| {
            let home = control.home_of(g.port).expect("attached");
            switches[home].port_counters(g.port).expect("attached")
        })
        .collect();
    let sent: u64 = counters.iter().map(|c| c.tx_frames).sum();
    let cut = counters.iter().any(|c| c.tx_segmented > 0);
    for (guest, c) in guests.iter().zip(&counters) {
        assert!(
            cut || c.rx_frames <= sent - c.tx_frames.min(sent),
            "more frames received than the others sent: {c:?}"
        );
        assert!(c.rx_buffers >= c.rx_frames, "a frame in no chain: {c:?}");
        assert!(!guest.isolated || c.rx_frames == 0, "an isolated port got another's frame: {c:?}");
        let broken = guest.broken.iter().any(|b| b.load(Ordering::Acquire));
        if broken || !(guest.rx.laid_out && guest.tx.laid_out) {
            continue;
        }
        let wrap = |n: u64| Some((n % (1 << 16)) as u16);
        let taken = c.tx_frames + c.tx_malformed + c.tx_spoofed;
        assert_eq!(guest.tx.used_idx(&guest.mem), wrap(taken), "transmit used: {c:?}");
        assert_eq!(guest.rx.used_idx(&guest.mem), wrap(c.rx_buffers + c.rx_malformed), "receive used: {c:?}");
    }
}
