//! A NIC served over vhost-user: a virtio-net device model whose two rings become one port of a
//! [`switch::Switch`] once both run. Its configuration space holds its MAC address; the
//! offloads its driver accepts (checksums, TCP super-frames, merged receive buffers) go with its
//! port, and the switch does for it whatever it did not accept.

use std::sync::Arc;

use switch::offload::{Offloads, OFFERED};
use switch::{MacAddr, Port, PortPolicy, SharedPortCounters, SwitchControl};
use virtio::net::{RX_QUEUE, TX_QUEUE, VIRTIO_NET_F_MAC};
use virtio::{DeviceStats, VIRTIO_F_EVENT_IDX, VIRTIO_F_INDIRECT_DESC, VIRTIO_F_VERSION_1};

use crate::device::{Device, Ring};
use crate::error::Error;

/// Configuration space: the MAC address, then the status word (not offered).
const CONFIG_LEN: usize = 8;

/// The NIC across connections: its address, and its rings while they are not on the switch.
pub struct VhostUserNet {
    config: [u8; CONFIG_LEN],
    policy: PortPolicy,
    /// The offloads its driver accepted, for its port.
    offloads: Offloads,
    /// What its port did, across its frontends' connections, for other threads.
    counters: Arc<SharedPortCounters>,
    control: Arc<SwitchControl>,
    stats: Arc<DeviceStats>,
    /// Rings started whose partner is not running yet, by ring index.
    waiting: [Option<Ring>; 2],
    /// The port on the switch, while both rings run.
    port: Option<usize>,
}

impl VhostUserNet {
    /// A NIC with address `mac`, held to `policy`, whose rings go on the switch `control`
    /// serves.
    pub fn new(mac: MacAddr, policy: PortPolicy, control: Arc<SwitchControl>) -> VhostUserNet {
        let mut config = [0u8; CONFIG_LEN];
        config[..6].copy_from_slice(&mac.0);
        let stats = Arc::new(DeviceStats::new(format!("vhost-user-net {mac}")));
        let counters = Arc::default();
        let offloads = Offloads::default();
        VhostUserNet { config, policy, offloads, counters, control, stats, waiting: [None, None], port: None }
    }

    /// What its port did so far, shared with other threads (its ports publish there).
    pub fn counters(&self) -> Arc<SharedPortCounters> {
        self.counters.clone()
    }

    /// Put the port on the switch once both rings wait.
    fn attach_if_paired(&mut self) -> Result<(), Error> {
        if self.waiting.iter().any(Option::is_none) {
            return Ok(());
        }
        let (Some(rx), Some(tx)) = (self.waiting[RX_QUEUE].take(), self.waiting[TX_QUEUE].take()) else {
            return Ok(());
        };
        // The receive ring is the one the switch writes guest memory through.
        let port = Port::new(rx.queue, tx.queue, rx.signals, tx.signals)
            .with_dirty_log(rx.log)
            .with_policy(self.policy)
            .with_offloads(self.offloads)
            .with_shared_counters(self.counters.clone());
        let id = self.control.attach(port).map_err(Error::Switch)?;
        log::info!("{}: on the switch as port {id}", self.stats.name());
        self.port = Some(id);
        Ok(())
    }
}

impl Device for VhostUserNet {
    fn stats(&self) -> &Arc<DeviceStats> {
        &self.stats
    }

    /// Besides the ring features and the address, the offloads Linux uses: checksums and TCP
    /// super-frames both ways, and merged receive buffers (the switch does for each receiver
    /// what it does not take).
    fn features(&self) -> u64 {
        1 << VIRTIO_F_VERSION_1
            | 1 << VIRTIO_F_EVENT_IDX
            | 1 << VIRTIO_F_INDIRECT_DESC
            | 1 << VIRTIO_NET_F_MAC
            | OFFERED
    }

    /// No configuration write (the address is read-only) and no in-flight tracking (a frame
    /// lost in a restart is as a frame lost on a wire).
    fn protocol_features(&self) -> u64 {
        crate::backend::BASE_PROTOCOL_FEATURES
    }

    fn num_queues(&self) -> usize {
        2
    }

    fn driver_features(&mut self, features: u64) {
        self.offloads = Offloads::from_features(features);
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        virtio::device::read_config_bytes(&self.config, offset, data);
    }

    fn start_ring(&mut self, index: usize, ring: Ring) -> Result<(), Error> {
        self.waiting[index] = Some(ring);
        self.attach_if_paired()
    }

    fn stop_ring(&mut self, index: usize) -> Result<u16, Error> {
        if let Some(ring) = self.waiting[index].take() {
            return Ok(ring.queue.next_avail());
        }
        let id = self.port.take().ok_or(Error::Detach(index))?;
        let parts = self.control.detach(id).map_err(Error::Switch)?.into_parts();
        let c = parts.counters;
        log::info!(
            "{}: off the switch; so far {} frames sent, {} received, {} dropped for want of a buffer, {} malformed, \
             {} to or from a NIC it is isolated from, {} spoofed; {} passes rate-limited",
            self.stats.name(),
            c.tx_frames,
            c.rx_frames,
            c.rx_no_buffer,
            c.tx_malformed + c.rx_malformed,
            c.tx_isolated,
            c.tx_spoofed,
            c.tx_rate_limited
        );
        // The other ring still runs as the session sees it: it waits for its partner again.
        let (stopped, other) = match index == RX_QUEUE {
            true => (parts.rx, Ring { queue: parts.tx, signals: parts.tx_signals, log: None, kick: None }),
            false => {
                (parts.tx, Ring { queue: parts.rx, signals: parts.rx_signals, log: parts.log, kick: None })
            }
        };
        self.waiting[1 - index] = Some(other);
        Ok(stopped.next_avail())
    }
}
