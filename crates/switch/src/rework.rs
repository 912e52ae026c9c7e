//! What the switch does for a receiver that does not take a frame's offloads: it fills in the
//! checksum the sender left, or cuts a TCP super-frame into segments, as the sender's NIC would
//! have. The frame is copied once into a buffer the switch allocated when it was made, however
//! many receivers need it changed.

use crate::offload::NetHeader;
use crate::segment;
use crate::switch::{MAX_JUMBO_FRAME_LEN, MAX_SUPER_FRAME_LEN};
use af_packet::checksum;

/// The switch's buffers for frames it changes.
pub(crate) struct Rework {
    /// The frame being switched, once a receiver needed it changed.
    frame: Box<[u8]>,
    len: usize,
    /// Whether `frame` holds the frame being switched (`None`: not yet), with its checksum
    /// filled in unless it is a super-frame (`Some(false)`: it could not be).
    loaded: Option<bool>,
    /// One segment of a super-frame.
    segment: Box<[u8]>,
}

impl Rework {
    pub(crate) fn new() -> Rework {
        Rework {
            frame: vec![0; MAX_SUPER_FRAME_LEN].into_boxed_slice(),
            len: 0,
            loaded: None,
            segment: vec![0; MAX_JUMBO_FRAME_LEN].into_boxed_slice(),
        }
    }

    /// Another frame is being switched.
    pub(crate) fn next_frame(&mut self) {
        self.loaded = None;
    }

    /// Hand the frame being switched, `len` bytes that `load` copies into the buffer it is
    /// given (`false`: it could not), to `each` as frames that need no offload: the frame with
    /// its checksum filled in, or a super-frame's segments (until `each` says it takes no
    /// more). `false`, with nothing handed over, if the frame is not what `header` says.
    pub(crate) fn frames(
        &mut self,
        load: impl FnOnce(&mut [u8]) -> bool,
        header: NetHeader,
        len: usize,
        mut each: impl FnMut(&[u8]) -> bool,
    ) -> bool {
        if self.loaded.is_none() {
            self.len = len.min(self.frame.len());
            let frame = &mut self.frame[..self.len];
            let checksummed = |frame: &mut [u8]| match (header.segmentation, header.checksum) {
                (None, Some((start, offset))) => checksum::finish_bytes(frame, start.into(), offset.into()),
                _ => true,
            };
            self.loaded = Some(len == frame.len() && load(frame) && checksummed(frame));
        }
        if self.loaded != Some(true) {
            return false;
        }
        let frame = &self.frame[..self.len];
        match header.segmentation {
            Some(segmentation) => segment::cut(frame, segmentation, &mut self.segment, each),
            None => {
                each(frame);
                true
            }
        }
    }
}
