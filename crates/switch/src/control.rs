//! How ports get on and off a running switch: a mailbox of commands the switch reads between
//! passes, so the data path never waits on a lock.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Mutex;
use std::time::Duration;

use thiserror::Error;
use vmm_sys_util::eventfd::EventFd;

use crate::port::Port;
use crate::switch::MAX_PORTS;

/// How long `detach` waits for the switch to hand a port back.
const DETACH_LIMIT: Duration = Duration::from_secs(5);

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

/// What a device model asks of the switch.
pub(crate) enum Command {
    Attach(usize, Box<Port>),
    Detach(usize, SyncSender<Option<Box<Port>>>),
}

/// How device models attach ports to a running switch and take them back: a mailbox the switch
/// reads between passes. Shared by the switch and every NIC on it.
pub struct SwitchControl {
    /// Commands are waiting: the only thing a pass reads of this without news.
    pending: AtomicBool,
    commands: Mutex<Vec<Command>>,
    /// Which port slots are taken: bit N for port N.
    taken: Mutex<u64>,
    /// Signalled with every command: wakes a switch whose IOCore sleeps.
    news: EventFd,
}

impl SwitchControl {
    /// A mailbox with nothing in it.
    pub fn new() -> std::io::Result<SwitchControl> {
        Ok(SwitchControl {
            pending: AtomicBool::new(false),
            commands: Mutex::default(),
            taken: Mutex::default(),
            news: EventFd::new(libc::EFD_NONBLOCK)?,
        })
    }

    /// The descriptor that is readable while news waits, and clearing it.
    pub(crate) fn news_fd(&self) -> RawFd {
        self.news.as_raw_fd()
    }

    pub(crate) fn clear_news_fd(&self) {
        let _ = self.news.read();
    }

    /// Are commands waiting? Clears the flag: the caller takes them now.
    pub(crate) fn take_news(&self) -> bool {
        self.pending.swap(false, Ordering::Acquire)
    }

    /// Are commands waiting?
    pub(crate) fn has_news(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// The commands sent since the last call.
    pub(crate) fn take_commands(&self) -> Vec<Command> {
        std::mem::take(&mut *self.commands.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn send(&self, command: Command) {
        self.commands.lock().unwrap_or_else(|e| e.into_inner()).push(command);
        self.pending.store(true, Ordering::Release);
        let _ = self.news.write(1);
    }

    /// Put `port` on the switch; its number, for [`SwitchControl::detach`].
    pub fn attach(&self, port: Port) -> Result<usize, SwitchError> {
        let id = {
            let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
            let id = (0..MAX_PORTS).find(|&id| *taken & 1 << id == 0).ok_or(SwitchError::Full)?;
            *taken |= 1 << id;
            id
        };
        self.send(Command::Attach(id, Box::new(port)));
        Ok(id)
    }

    /// Take port `id` off the switch, once the switch has finished the pass it is in.
    pub fn detach(&self, id: usize) -> Result<Port, SwitchError> {
        let (reply, answer): (_, Receiver<_>) = mpsc::sync_channel(1);
        self.send(Command::Detach(id, reply));
        let port = answer.recv_timeout(DETACH_LIMIT).map_err(|_| SwitchError::DetachTimedOut(id))?;
        *self.taken.lock().unwrap_or_else(|e| e.into_inner()) &= !(1 << id);
        port.map(|p| *p).ok_or(SwitchError::DetachTimedOut(id))
    }
}
