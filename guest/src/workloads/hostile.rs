//! What the hostile workloads share: addresses no valid descriptor has, publishing a case's
//! broken chain, and watching what the device does with it.

use crate::deadline::Deadline;
use crate::virtio::device_status::NEEDS_RESET;
use crate::virtio::mmio::Transport;
use crate::virtio::queue::SplitQueue;

/// Far above any guest RAM, but a sane 48-bit physical address.
pub const OUTSIDE_RAM: u64 = 0xffff_f000_0000;
/// With a length of 0x2000, this address wraps past 2^64.
pub const WRAPPING: u64 = 0xffff_ffff_ffff_f000;
/// How many polls of the used ring per read of the Status register (each read is an exit).
const POLLS_PER_STATUS_READ: u32 = 64;
/// How long to keep watching after a case's first completion.
const SETTLE_MS: u64 = 50;

/// The device under abuse, seen through the one queue the cases go on.
pub trait Target {
    fn queue(&mut self) -> &mut SplitQueue;
    fn transport(&self) -> &Transport;
    /// Notify the device about that queue.
    fn notify(&mut self);
}

/// InterruptStatus bit: the configuration changed (how a device announces DEVICE_NEEDS_RESET).
const INT_CONFIG_CHANGE: u32 = 2;

/// How a case offers its chain (head 0) in the avail ring.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Once, as a driver should.
    Head,
    /// Twice in a row: the same buffers in flight twice.
    HeadTwice,
    /// Not at all: the avail index moves more than the queue size ahead instead.
    AvailIndexJump,
}

/// Offer the chain at head 0 as `offer` says, then notify.
pub fn publish(dev: &mut impl Target, offer: Offer) {
    let queue = dev.queue();
    match offer {
        Offer::Head => queue.push(0),
        Offer::HeadTwice => {
            queue.push(0);
            queue.push(0);
        }
        Offer::AvailIndexJump => {
            let size = queue.size();
            queue.publish_raw_avail_idx(queue.avail_idx().wrapping_add(size).wrapping_add(5));
        }
    }
    if offer != Offer::AvailIndexJump {
        queue.publish();
    }
    // Always notify: the point is that the device looks.
    dev.notify();
}

/// What the device did with one case's chain (head 0).
pub struct Observed {
    /// (used id, length) of the first completion, if any.
    pub used: Option<(u32, u32)>,
    /// Completions seen in all: more than one means the device took chains that were never
    /// offered.
    pub used_count: u32,
    pub device_status: u32,
    /// InterruptStatus at the end, unacknowledged.
    pub interrupt_status: u32,
}

impl Observed {
    pub fn needs_reset(&self) -> bool {
        self.device_status & NEEDS_RESET != 0
    }

    /// Did the device raise a configuration-change interrupt (as it must with NEEDS_RESET)?
    pub fn config_interrupt(&self) -> bool {
        self.interrupt_status & INT_CONFIG_CHANGE != 0
    }

    /// Can the queue go on as it is? Only after the one chain came back and nothing else did.
    pub fn queue_intact(&self) -> bool {
        !self.needs_reset() && matches!(self.used, Some((0, _))) && self.used_count == 1
    }

    /// Must the device be reset before the next case: is the queue broken, or (after an avail
    /// index jump or a head offered twice) out of step with the driver?
    pub fn reset_needed(&self, offer: Offer) -> bool {
        !self.queue_intact() || offer != Offer::Head
    }

    pub fn used_id(&self) -> Option<u32> {
        self.used.map(|(id, _)| id)
    }

    pub fn used_len(&self) -> Option<u32> {
        self.used.map(|(_, len)| len)
    }
}

/// Wait for a completion, DEVICE_NEEDS_RESET, or the deadline; after the first completion
/// (when `on_first` runs), keep watching for `SETTLE_MS` for more completions or a late
/// DEVICE_NEEDS_RESET.
pub fn observe<T: Target>(
    dev: &mut T,
    mut deadline: Deadline,
    tsc_khz: u64,
    mut on_first: impl FnMut(&T),
) -> Observed {
    let mut polls = 0u32;
    let mut used = None;
    let mut used_count = 0;
    let mut finished = false;
    loop {
        while let Some(entry) = dev.queue().pop_used() {
            if used.is_none() {
                used = Some(entry);
                on_first(dev);
                deadline = Deadline::after_ms(tsc_khz, SETTLE_MS);
            }
            used_count += 1;
        }
        // One more look at the used ring after the status said stop: what the device
        // completed before it set DEVICE_NEEDS_RESET counts.
        if finished {
            break;
        }
        polls = polls.wrapping_add(1);
        finished = polls.is_multiple_of(POLLS_PER_STATUS_READ)
            && (dev.transport().status() & NEEDS_RESET != 0 || deadline.passed());
        core::hint::spin_loop();
    }
    let transport = dev.transport();
    Observed {
        used,
        used_count,
        device_status: transport.status(),
        interrupt_status: transport.interrupt_status(),
    }
}
