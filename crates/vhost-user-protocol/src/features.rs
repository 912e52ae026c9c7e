//! The feature bits the vhost-user protocol adds to virtio's.

/// The feature bit that says the backend speaks protocol features (not a virtio feature).
pub const VHOST_USER_F_PROTOCOL_FEATURES: u32 = 30;

/// VHOST_F_LOG_ALL: the backend can log the guest pages it writes into a dirty log shared by
/// the frontend (SET_LOG_BASE), for live migration; acked in SET_FEATURES while migrating.
pub const VHOST_F_LOG_ALL: u32 = 26;

/// Protocol feature bits.
pub mod protocol {
    /// VHOST_USER_PROTOCOL_F_MQ: the backend says how many queues it has (GET_QUEUE_NUM); the
    /// specification asks every backend to offer it, even with a fixed number of queues.
    pub const MQ: u32 = 0;
    /// VHOST_USER_PROTOCOL_F_LOG_SHMFD: SET_LOG_BASE carries the dirty log as a shared memory
    /// descriptor, and the backend replies once it has mapped it.
    pub const LOG_SHMFD: u32 = 1;
    /// VHOST_USER_PROTOCOL_F_RARP: after a live migration, the frontend asks a net backend to
    /// announce the guest's address for it (SEND_RARP), when the guest does not itself.
    pub const RARP: u32 = 2;
    /// VHOST_USER_PROTOCOL_F_REPLY_ACK: the frontend may set [`crate::message::FLAG_NEED_REPLY`]
    /// on any request and gets a u64 back, 0 for success, unless the request has a reply of its
    /// own.
    pub const REPLY_ACK: u32 = 3;
    /// VHOST_USER_PROTOCOL_F_NET_MTU: the frontend tells a net backend the MTU its guest was
    /// given (NET_SET_MTU), which the backend may refuse.
    pub const NET_MTU: u32 = 4;
    /// VHOST_USER_PROTOCOL_F_CONFIG: the frontend reads the device's configuration space with
    /// GET_CONFIG and writes it with SET_CONFIG (exitless's backend takes only virtio-blk's
    /// `writeback` byte, as QEMU sends it for VIRTIO_BLK_F_CONFIG_WCE).
    pub const CONFIG: u32 = 9;
    /// VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD: the backend keeps which requests it holds in
    /// memory shared with the frontend (GET_INFLIGHT_FD / SET_INFLIGHT_FD), so that a backend
    /// restarted after a crash can resubmit them.
    pub const INFLIGHT_SHMFD: u32 = 12;
}
