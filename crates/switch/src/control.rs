//! What the switches of one daemon share (one switch per IOCore): how ports get on and off them,
//! a mailbox per switch that it reads between passes, so the data path never waits on a lock;
//! which switch serves each port; the address table; the rings that carry frames from one
//! switch to another, and how a switch that sleeps is woken for them.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Mutex;
use std::time::Duration;

use thiserror::Error;
use vmm_sys_util::eventfd::EventFd;

use crate::ethernet::MacAddr;
use crate::handoff::{self, Sender};
use crate::mac_table::MacTable;
use crate::port::Port;
use crate::switch::MAX_PORTS;

/// How long `detach` waits for the switch to hand a port back.
const DETACH_LIMIT: Duration = Duration::from_secs(5);
/// The most switches one daemon runs.
pub const MAX_SWITCHES: usize = 16;
/// `uplink_home` while no switch has the uplink.
const NO_UPLINK: usize = usize::MAX;

/// Why a port could not be attached or detached.
#[derive(Debug, Error)]
pub enum SwitchError {
    /// Every port slot is taken.
    #[error("the switch has no free port (it serves at most {MAX_PORTS})")]
    Full,
    /// The switch did not hand the port back in time: its IOCore is not serving it.
    #[error("the switch did not hand port {0} back within {DETACH_LIMIT:?}")]
    DetachTimedOut(usize),
}

/// What a device model asks of a switch.
pub(crate) enum Command {
    Attach(usize, Box<Port>),
    Detach(usize, SyncSender<Option<Box<Port>>>),
    Announce(usize, MacAddr),
}

/// The rings a switch sends frames to the others on, and reads theirs from, by switch.
pub(crate) struct Links {
    pub(crate) to: Vec<Option<Sender>>,
    pub(crate) from: Vec<Option<handoff::Receiver>>,
}

/// One switch's mailbox and wake-up.
struct Member {
    /// Commands are waiting: the only thing a pass reads of this without news.
    pending: AtomicBool,
    commands: Mutex<Vec<Command>>,
    /// Signalled with every command, and with hand-offs while the switch sleeps: wakes a
    /// switch whose IOCore sleeps.
    news: EventFd,
    /// The switch asked for kicks (its IOCore may sleep): hand-offs must signal `news`.
    asleep: AtomicBool,
    /// Ports attached to it.
    ports: AtomicUsize,
    /// Its rings, until the switch takes them.
    links: Mutex<Option<Links>>,
}

/// How device models attach ports to the running switches and take them back, and what the
/// switches share. Shared by the switches and every NIC on them.
pub struct SwitchControl {
    members: Box<[Member]>,
    /// Which port slots are taken: bit N for port N.
    taken: Mutex<u64>,
    /// Port N's switch plus one (0: none).
    homes: [AtomicU8; MAX_PORTS],
    /// Port N is isolated to the uplink.
    isolated: [AtomicBool; MAX_PORTS],
    /// The switch that has the uplink, or `NO_UPLINK`.
    uplink_home: AtomicUsize,
    pub(crate) table: MacTable,
}

impl SwitchControl {
    /// What one switch needs (a daemon with one IOCore).
    pub fn new() -> std::io::Result<SwitchControl> {
        Self::with_switches(1)
    }

    /// What `switches` switches share (one per IOCore; at most [`MAX_SWITCHES`]): each port
    /// goes to the one with the fewest ports.
    pub fn with_switches(switches: usize) -> std::io::Result<SwitchControl> {
        let switches = switches.clamp(1, MAX_SWITCHES);
        let mut links: Vec<Links> = (0..switches)
            .map(|_| Links {
                to: (0..switches).map(|_| None).collect(),
                from: (0..switches).map(|_| None).collect(),
            })
            .collect();
        for from in 0..switches {
            for to in (0..switches).filter(|&to| to != from) {
                let (sender, receiver) = handoff::ring();
                links[from].to[to] = Some(sender);
                links[to].from[from] = Some(receiver);
            }
        }
        let members = links
            .into_iter()
            .map(|links| {
                Ok(Member {
                    pending: AtomicBool::new(false),
                    commands: Mutex::default(),
                    news: EventFd::new(libc::EFD_NONBLOCK)?,
                    asleep: AtomicBool::new(false),
                    ports: AtomicUsize::new(0),
                    links: Mutex::new(Some(links)),
                })
            })
            .collect::<std::io::Result<_>>()?;
        Ok(SwitchControl {
            members,
            taken: Mutex::default(),
            homes: std::array::from_fn(|_| AtomicU8::new(0)),
            isolated: std::array::from_fn(|_| AtomicBool::new(false)),
            uplink_home: AtomicUsize::new(NO_UPLINK),
            table: MacTable::default(),
        })
    }

    /// How many switches share this.
    pub fn switches(&self) -> usize {
        self.members.len()
    }

    /// Switch `index`'s rings to and from the others; `None` once taken (or past the last).
    pub(crate) fn take_links(&self, index: usize) -> Option<Links> {
        self.members.get(index)?.links.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// The descriptor that is readable while news waits for switch `index`, and clearing it.
    pub(crate) fn news_fd(&self, index: usize) -> RawFd {
        self.members[index].news.as_raw_fd()
    }

    pub(crate) fn clear_news_fd(&self, index: usize) {
        let _ = self.members[index].news.read();
    }

    /// Are commands waiting for switch `index`? Clears the flag: the caller takes them now.
    pub(crate) fn take_news(&self, index: usize) -> bool {
        self.members[index].pending.swap(false, Ordering::Acquire)
    }

    /// Are commands waiting for switch `index`?
    pub(crate) fn has_news(&self, index: usize) -> bool {
        self.members[index].pending.load(Ordering::Acquire)
    }

    /// The commands sent to switch `index` since the last call.
    pub(crate) fn take_commands(&self, index: usize) -> Vec<Command> {
        std::mem::take(&mut *self.members[index].commands.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Switch `index` asked for kicks, so its IOCore may sleep (`asleep`), or polls. Before it
    /// sleeps it looks at its rings from the others once more (`has_pending`), a load the fence
    /// keeps after this store (see [`SwitchControl::wake`]).
    pub(crate) fn set_asleep(&self, index: usize, asleep: bool) {
        self.members[index].asleep.store(asleep, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Frames were handed off to switch `index`: wake it if it sleeps. The fence pairs with
    /// `set_asleep`'s: either this sees it asleep, or it sees these frames before it sleeps.
    pub(crate) fn wake(&self, index: usize) {
        fence(Ordering::SeqCst);
        if self.members[index].asleep.load(Ordering::SeqCst) {
            let _ = self.members[index].news.write(1);
        }
    }

    /// The switch (the IOCore, by index) that serves port `id`, if one does.
    pub fn home_of(&self, id: usize) -> Option<usize> {
        let home = self.homes.get(id)?.load(Ordering::Acquire);
        (home > 0).then(|| usize::from(home) - 1)
    }

    /// Is port `id` isolated to the uplink?
    pub(crate) fn is_isolated(&self, id: usize) -> bool {
        self.isolated.get(id).is_some_and(|flag| flag.load(Ordering::Acquire))
    }

    /// Does switch `index` serve any port?
    pub(crate) fn has_ports(&self, index: usize) -> bool {
        self.members[index].ports.load(Ordering::Acquire) > 0
    }

    /// Switch `index` has the uplink.
    pub(crate) fn set_uplink_home(&self, index: usize) {
        self.uplink_home.store(index, Ordering::Release);
    }

    /// The switch that has the uplink, if one does.
    pub(crate) fn uplink_home(&self) -> Option<usize> {
        Some(self.uplink_home.load(Ordering::Acquire)).filter(|&home| home != NO_UPLINK)
    }

    fn send(&self, index: usize, command: Command) {
        let member = &self.members[index];
        member.commands.lock().unwrap_or_else(|e| e.into_inner()).push(command);
        member.pending.store(true, Ordering::Release);
        let _ = member.news.write(1);
    }

    /// Put `port` on the switch with the fewest ports; its number, for [`SwitchControl::detach`].
    pub fn attach(&self, port: Port) -> Result<usize, SwitchError> {
        let (id, home) = {
            let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
            let id = (0..MAX_PORTS).find(|&id| *taken & 1 << id == 0).ok_or(SwitchError::Full)?;
            *taken |= 1 << id;
            let load = |index: &usize| self.members[*index].ports.load(Ordering::Acquire);
            let home = (0..self.members.len()).min_by_key(load).unwrap_or(0);
            self.members[home].ports.fetch_add(1, Ordering::AcqRel);
            // At most MAX_SWITCHES switches: the home fits.
            self.homes[id].store(home as u8 + 1, Ordering::Release);
            self.isolated[id].store(port.isolated_to.is_some(), Ordering::Release);
            (id, home)
        };
        self.send(home, Command::Attach(id, Box::new(port)));
        Ok(id)
    }

    /// Have port `id` announce address `mac` (a broadcast RARP from it, as if the port sent it),
    /// on its switch's next pass.
    pub fn announce(&self, id: usize, mac: MacAddr) {
        if let Some(home) = self.home_of(id) {
            self.send(home, Command::Announce(id, mac));
        }
    }

    /// Take port `id` off its switch, once the switch has finished the pass it is in.
    pub fn detach(&self, id: usize) -> Result<Port, SwitchError> {
        let home = self.home_of(id).ok_or(SwitchError::DetachTimedOut(id))?;
        let (reply, answer): (_, Receiver<_>) = mpsc::sync_channel(1);
        self.send(home, Command::Detach(id, reply));
        let port = answer.recv_timeout(DETACH_LIMIT).map_err(|_| SwitchError::DetachTimedOut(id))?;
        {
            let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
            *taken &= !(1 << id);
            self.homes[id].store(0, Ordering::Release);
            self.members[home].ports.fetch_sub(1, Ordering::AcqRel);
        }
        port.map(|p| *p).ok_or(SwitchError::DetachTimedOut(id))
    }
}
