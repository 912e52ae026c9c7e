//! A NIC served over vhost-user: a virtio-net device model whose queue pairs (up to
//! [`MAX_PAIRS`], VIRTIO_NET_F_MQ) become one port of a [`switch::Switch`] as they run. Its
//! configuration space holds its MAC address; the offloads its driver accepts (checksums, TCP
//! super-frames, merged receive buffers) go with its port, and the switch does for it whatever it
//! did not accept.

use std::sync::Arc;

use switch::offload::{Offloads, OFFERED};
use switch::{MacAddr, Port, PortPolicy, QueuePair, SharedPortCounters, SwitchControl};
use virtio::net::VIRTIO_NET_F_MAC;
use virtio::{DeviceStats, VIRTIO_F_EVENT_IDX, VIRTIO_F_INDIRECT_DESC, VIRTIO_F_VERSION_1};

use vhost_user_protocol::features::protocol;

use crate::device::{Device, Ring};
use crate::error::Error;

/// Feature bit: the device says its MTU, the largest the driver may use (in the configuration
/// space).
const VIRTIO_NET_F_MTU: u32 = 3;
/// Feature bit: the driver announces its address when asked (after a live migration).
const VIRTIO_NET_F_GUEST_ANNOUNCE: u32 = 21;
/// Feature bit: several queue pairs (their number in the configuration space).
const VIRTIO_NET_F_MQ: u32 = 22;
/// Queue pairs a NIC offers (`max_virtqueue_pairs`): a driver uses one per CPU, up to this.
pub const MAX_PAIRS: usize = 4;
/// Configuration space: the MAC address, the status word (STATUS is not offered),
/// `max_virtqueue_pairs` and the MTU.
const CONFIG_LEN: usize = 12;
/// Its rings: queue pair `i`'s receive ring is ring `2i`, its transmit ring `2i + 1`.
const RINGS: usize = 2 * MAX_PAIRS;

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
    /// Rings started and not on the switch (their partner is not running yet, or the port is
    /// being rebuilt), by ring index.
    waiting: [Option<Ring>; RINGS],
    /// The port on the switch, and the queue pairs it holds, in its order.
    port: Option<(usize, Vec<usize>)>,
}

impl VhostUserNet {
    /// A NIC with address `mac`, held to `policy`, whose rings go on the switch `control`
    /// serves.
    pub fn new(mac: MacAddr, policy: PortPolicy, control: Arc<SwitchControl>) -> VhostUserNet {
        let mut config = [0u8; CONFIG_LEN];
        config[..6].copy_from_slice(&mac.0);
        config[8..10].copy_from_slice(&u16::try_from(MAX_PAIRS).unwrap_or(u16::MAX).to_le_bytes());
        config[10..12].copy_from_slice(&policy.mtu().to_le_bytes());
        VhostUserNet {
            config,
            policy,
            offloads: Offloads::default(),
            counters: Arc::default(),
            control,
            stats: Arc::new(DeviceStats::new(format!("vhost-user-net {mac}"))),
            waiting: Default::default(),
            port: None,
        }
    }

    /// What its port did so far, shared with other threads (its ports publish there).
    pub fn counters(&self) -> Arc<SharedPortCounters> {
        self.counters.clone()
    }

    /// Put every queue pair whose two rings wait on the switch, as one port.
    fn attach(&mut self) -> Result<(), Error> {
        let pairs: Vec<usize> = (0..MAX_PAIRS)
            .filter(|&p| self.waiting[2 * p].is_some() && self.waiting[2 * p + 1].is_some())
            .collect();
        let mut port: Option<Port> = None;
        let mut log = None;
        for &p in &pairs {
            let (Some(rx), Some(tx)) = (self.waiting[2 * p].take(), self.waiting[2 * p + 1].take()) else {
                continue;
            };
            // The receive rings are the ones the switch writes guest memory through.
            log = log.or(rx.log);
            let pair = QueuePair {
                rx: rx.queue,
                tx: tx.queue,
                rx_signals: rx.signals,
                tx_signals: tx.signals,
                tx_kick: tx.kick,
            };
            port = Some(match port {
                None => Port::new(pair),
                Some(port) => port.with_pair(pair),
            });
        }
        let Some(port) = port else { return Ok(()) };
        let port = port
            .with_dirty_log(log)
            .with_policy(self.policy)
            .with_offloads(self.offloads)
            .with_shared_counters(self.counters.clone());
        let id = self.control.attach(port).map_err(Error::Switch)?;
        let iocore = self.control.home_of(id).unwrap_or(0);
        log::info!(
            "{}: on the switch as port {id} (IOCore {iocore}), queue pairs {pairs:?}",
            self.stats.name()
        );
        self.port = Some((id, pairs));
        Ok(())
    }

    /// Take the port off the switch, its rings back to waiting.
    fn detach(&mut self) -> Result<(), Error> {
        let Some((id, pairs)) = self.port.take() else { return Ok(()) };
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
        for (p, pair) in pairs.into_iter().zip(parts.pairs) {
            let QueuePair { rx, tx, rx_signals, tx_signals, tx_kick } = pair;
            self.waiting[2 * p] =
                Some(Ring { queue: rx, signals: rx_signals, log: parts.log.clone(), kick: None });
            self.waiting[2 * p + 1] = Some(Ring { queue: tx, signals: tx_signals, log: None, kick: tx_kick });
        }
        Ok(())
    }
}

impl Device for VhostUserNet {
    fn stats(&self) -> &Arc<DeviceStats> {
        &self.stats
    }

    /// Besides the ring features and the address, the offloads Linux uses: checksums and TCP
    /// super-frames both ways, and merged receive buffers (the switch does for each receiver
    /// what it does not take); several queue pairs; and the guest's announcement of its
    /// address after a live migration, which QEMU asks for and acknowledges on the control
    /// queue it keeps (the announcement itself is frames like any other, which the switch
    /// learns the address from).
    fn features(&self) -> u64 {
        1 << VIRTIO_F_VERSION_1
            | 1 << VIRTIO_F_EVENT_IDX
            | 1 << VIRTIO_F_INDIRECT_DESC
            | 1 << VIRTIO_NET_F_MAC
            | 1 << VIRTIO_NET_F_GUEST_ANNOUNCE
            | 1 << VIRTIO_NET_F_MQ
            | 1 << VIRTIO_NET_F_MTU
            | OFFERED
    }

    /// The frontend's MTU, to check (NET_MTU), and its request to announce the guest's
    /// address after a live migration (RARP); no configuration write (the address is
    /// read-only) and no in-flight tracking (a frame lost in a restart is as a frame lost on a
    /// wire).
    fn protocol_features(&self) -> u64 {
        crate::backend::BASE_PROTOCOL_FEATURES | 1 << protocol::NET_MTU | 1 << protocol::RARP
    }

    /// A RARP from `mac`, as if the guest sent it, once the NIC is on the switch: the
    /// switches and the network beyond the uplink learn where it is. Before that there is
    /// nothing to announce from (QEMU asks once the guest runs).
    fn announce(&mut self, mac: [u8; 6]) -> Result<(), Error> {
        match self.port {
            Some((id, _)) => self.control.announce(id, MacAddr(mac)),
            None => log::warn!(
                "{}: asked to announce {} before it runs: not announced",
                self.stats.name(),
                MacAddr(mac)
            ),
        }
        Ok(())
    }

    fn num_queues(&self) -> usize {
        RINGS
    }

    fn driver_features(&mut self, features: u64) {
        self.offloads = Offloads::from_features(features);
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        virtio::device::read_config_bytes(&self.config, offset, data);
    }

    /// A guest may use any MTU up to the NIC's: the switch passes its frames on.
    fn check_mtu(&mut self, mtu: u64) -> Result<(), Error> {
        let most = self.policy.mtu();
        match mtu <= u64::from(most) {
            true => Ok(()),
            false => Err(Error::MtuTooLarge { asked: mtu, mtu: most }),
        }
    }

    /// The port is rebuilt with every queue pair that now runs.
    fn start_ring(&mut self, index: usize, ring: Ring) -> Result<(), Error> {
        self.detach()?;
        self.waiting[index] = Some(ring);
        self.attach()
    }

    /// The port is rebuilt without the ring's queue pair.
    fn stop_ring(&mut self, index: usize) -> Result<u16, Error> {
        if self.waiting[index].is_none() {
            self.detach()?;
        }
        let ring = self.waiting[index].take().ok_or(Error::Detach(index))?;
        self.attach()?;
        Ok(ring.queue.next_avail())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nic(mtu: Option<u16>) -> VhostUserNet {
        let mac: MacAddr = "52:54:00:00:00:01".parse().unwrap();
        let policy = PortPolicy { mac: Some(mac), mtu, ..PortPolicy::default() };
        VhostUserNet::new(mac, policy, Arc::new(SwitchControl::new().unwrap()))
    }

    #[test]
    fn the_configuration_space_says_the_mtu_and_a_larger_one_from_the_frontend_is_refused() {
        let mut jumbo = nic(Some(9000));
        let mut config = [0u8; CONFIG_LEN];
        jumbo.read_config(0, &mut config);
        assert_eq!(config[..6], [0x52, 0x54, 0, 0, 0, 1]);
        assert_eq!(u16::from_le_bytes([config[10], config[11]]), 9000);
        assert!(jumbo.features() & 1 << VIRTIO_NET_F_MTU != 0);
        assert!(jumbo.check_mtu(9000).is_ok() && jumbo.check_mtu(1500).is_ok());
        let refused = jumbo.check_mtu(9001).unwrap_err().to_string();
        assert!(
            refused.starts_with("NET_SET_MTU of 9001: this NIC takes frames of an MTU of 9000"),
            "{refused}"
        );
        let mut standard = nic(None);
        standard.read_config(10, &mut config[..2]);
        assert_eq!(u16::from_le_bytes([config[0], config[1]]), 1500);
        assert!(standard.check_mtu(1500).is_ok() && standard.check_mtu(9000).is_err());
    }
}
