//! A guest's TCP super-frames on their way to the host: any bytes as the frame (its Ethernet, IP
//! and TCP headers built or not), any segment size and checksum offsets, any interface MTU.
//! `host_header`, which decides what the switch passes to the host's kernel whole, either
//! refuses the frame or gives a virtio-net header the kernel takes from an untrusted sender: a
//! TCP segmentation of the size asked, the checksum left inside the headers `hdr_len` covers,
//! `hdr_len` within the frame. And a frame it passes whole is one the switch could cut itself
//! (`cut` agrees), into segments that each fit the interface.
#![no_main]

use arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use switch::offload::{NetHeader, Segmentation, MIN_MSS};
use switch::segment::{cut, host_header, MAX_HEADERS_LEN};

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});

fn run(u: &mut Unstructured) -> Result<()> {
    let mss = u.int_in_range(MIN_MSS..=9000)?;
    let segmentation = match u.arbitrary()? {
        true => Segmentation::Tcp4 { mss },
        false => Segmentation::Tcp6 { mss },
    };
    let checksum = (u.int_in_range(0..=200u16)?, u.int_in_range(0..=40u16)?);
    let header = NetHeader { checksum: Some(checksum), segmentation: Some(segmentation) };
    let max_segment_len = u.int_in_range(60..=9014usize)?;
    let mut frame = Vec::new();
    // Headers most of the time: Ethernet with IPv4 or IPv6 (or a VLAN tag), then the rest.
    match u.int_in_range(0..=3u8)? {
        0 => {}
        kind => {
            frame.extend_from_slice(&[0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2]);
            frame.extend_from_slice(match kind {
                1 => &[0x08, 0x00],
                2 => &[0x86, 0xdd],
                _ => &[0x81, 0x00],
            });
        }
    }
    let rest = u.int_in_range(0..=12_000usize)?;
    frame.extend(u.bytes(rest.min(u.len()))?);
    let start = &frame[..frame.len().min(MAX_HEADERS_LEN)];
    let Ok(vnet) = host_header(start, header, max_segment_len) else { return Ok(()) };
    let word = |at: usize| usize::from(u16::from_le_bytes([vnet[at], vnet[at + 1]]));
    let (flags, gso_type, hdr_len, gso_size) = (vnet[0], vnet[1], word(2), word(4));
    let (csum_start, csum_offset) = (word(6), word(8));
    assert_eq!(flags, 1, "the checksum is left: {vnet:?}");
    let expected_type = match segmentation {
        Segmentation::Tcp4 { .. } => 1,
        Segmentation::Tcp6 { .. } => 4,
    };
    assert_eq!((gso_type, gso_size), (expected_type, usize::from(mss)), "{vnet:?}");
    assert!(csum_start + csum_offset + 2 <= hdr_len && hdr_len <= frame.len(), "{vnet:?} of {}", frame.len());
    assert!(hdr_len + usize::from(mss) <= max_segment_len, "{vnet:?}: segments too long");
    let mut out = vec![0u8; max_segment_len];
    let mut longest = 0;
    let cuttable = cut(&frame, segmentation, &mut out, |segment| {
        longest = longest.max(segment.len());
        true
    });
    assert!(cuttable, "passed whole, but the switch could not cut it: {vnet:?}");
    assert!(longest <= max_segment_len);
    Ok(())
}
