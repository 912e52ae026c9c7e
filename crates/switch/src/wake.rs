//! What wakes a switch whose IOCore sleeps (its adaptive and notified modes): one epoll instance
//! over every port's transmit kicks, the control mailbox's news (commands, and frames other
//! switches handed to it) and the uplink's socket. The
//! IOCore sleeps on its descriptor as on a backend's (`QueueWorker::backend_fd`); while the
//! switch polls, nothing here is touched.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use crate::control::SwitchControl;
use crate::port::Port;

/// The token of the mailbox's news; a kick's is `port << 8 | pair`.
const NEWS: u64 = u64::MAX;
/// The token of the uplink's socket.
const UPLINK: u64 = u64::MAX - 1;
/// Events taken from the epoll instance per wake-up; more stay ready for the next.
const EVENTS: usize = 32;

/// The epoll instance, and room for what it reports.
pub(crate) struct Wakers {
    epoll: Epoll,
    events: [EpollEvent; EVENTS],
}

impl Wakers {
    /// Woken by `control`'s news for switch `index`.
    pub(crate) fn new(control: &SwitchControl, index: usize) -> io::Result<Wakers> {
        let wakers = Wakers { epoll: Epoll::new()?, events: [EpollEvent::default(); EVENTS] };
        wakers.add(control.news_fd(index), NEWS)?;
        Ok(wakers)
    }

    /// The descriptor that is readable while something woke the switch.
    pub(crate) fn fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// Woken by frames arriving on the uplink's socket `fd`.
    pub(crate) fn add_uplink(&self, fd: RawFd) -> io::Result<()> {
        self.add(fd, UPLINK)
    }

    /// Woken by the transmit kicks of port `id`.
    pub(crate) fn add_port(&self, id: usize, port: &Port) {
        for (pair, kick) in kicks(port) {
            if let Err(error) = self.add(kick, token(id, pair)) {
                log::warn!("port {id}: its transmit kick {pair} cannot wake the switch: {error}");
            }
        }
    }

    /// No longer woken by the transmit kicks of `port`, which leaves the switch.
    pub(crate) fn remove_port(&self, port: &Port) {
        for (_, kick) in kicks(port) {
            let _ = self.epoll.ctl(ControlOperation::Delete, kick, EpollEvent::default());
        }
    }

    /// Clear what woke the switch (kicks and news; the uplink's socket is cleared by taking its
    /// frames), so that its IOCore sleeps again once the pass that follows found nothing.
    pub(crate) fn clear(&mut self, control: &SwitchControl, index: usize, ports: &[Option<Box<Port>>]) {
        let Ok(ready) = self.epoll.wait(0, &mut self.events) else { return };
        for event in &self.events[..ready] {
            match event.data() {
                NEWS => control.clear_news_fd(index),
                UPLINK => {}
                token => {
                    let (id, pair) = ((token >> 8) as usize, (token & 0xff) as usize);
                    let kick =
                        ports.get(id).and_then(|port| port.as_deref()?.pairs.get(pair)?.tx_kick.as_deref());
                    if let Some(kick) = kick {
                        let _ = kick.read();
                    }
                }
            }
        }
    }

    fn add(&self, fd: RawFd, token: u64) -> io::Result<()> {
        self.epoll.ctl(ControlOperation::Add, fd, EpollEvent::new(EventSet::IN, token))
    }
}

/// The transmit kicks of `port`, by queue pair.
fn kicks(port: &Port) -> impl Iterator<Item = (usize, RawFd)> + '_ {
    port.pairs.iter().enumerate().filter_map(|(pair, p)| Some((pair, p.tx_kick.as_deref()?.as_raw_fd())))
}

fn token(id: usize, pair: usize) -> u64 {
    (id as u64) << 8 | pair as u64
}
