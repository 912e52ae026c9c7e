//! The source's side: a thread that, given a job, connects to the destination, switches on
//! KVM's dirty log, copies guest memory while the guest runs until few pages are left dirty,
//! then waits for the VMM's main thread to pause the VM and hand over its state, and sends the
//! last dirty pages and the state.

use std::io::Write;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use kvm_bindings::{kvm_userspace_memory_region, KVM_MEM_LOG_DIRTY_PAGES};
use kvm_ioctls::VmFd;
use sandbox::Filter;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use super::transport::{self, MigrationTls, Out};
use super::url::MigrationUrl;
use super::wire::{self, Hello, MAX_RECORD_PAGES, PAGE};
use super::{DirtyBitmap, MigrationError, MigrationReport};

/// Pre-copy stops once a round has sent at most this many pages (4 MiB: a few milliseconds on
/// a Unix socket), the rest going in the stop-and-copy.
const CONVERGED_PAGES: u64 = 1024;
/// Pre-copy stops after this many rounds even if the guest dirties pages faster than they go.
const MAX_ROUNDS: usize = 30;

/// A migration to carry out.
pub(crate) struct Job {
    /// `unix:/PATH`, `tcp:IP:PORT` or `tcp+plain:IP:PORT`.
    pub url: MigrationUrl,
    /// This host's certificate, and the CA the destination's must be signed by (a `tcp:` URL).
    pub tls: Option<Arc<MigrationTls>>,
    pub hello: Hello,
    /// What the devices' workers mark (switched on by the main thread before the job starts).
    pub device_log: Arc<DirtyBitmap>,
    /// Where the thread tells the main thread how it goes.
    pub steps: SyncSender<Step>,
    /// The VM's state (snapshot JSON) once paused; `None`: the pause failed, give up.
    pub finish: Receiver<Option<Vec<u8>>>,
}

/// What the sending thread tells the main thread.
pub(crate) enum Step {
    /// Pre-copy is done (few pages left dirty): pause the VM and send its state. Or it failed.
    Converged(Result<(), MigrationError>),
    /// The destination has the VM and resumed it, or the migration failed.
    Done(Result<MigrationReport, MigrationError>),
}

/// The sending thread, idle until given a job.
pub(crate) struct Sender {
    jobs: Option<SyncSender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Sender {
    /// Start the thread, which confines itself with `filter` at once (the caller's own filter
    /// comes later, so the thread is not bound by it).
    pub fn spawn(vm: Arc<VmFd>, mem: GuestMemoryMmap, filter: Filter) -> std::io::Result<Sender> {
        let (jobs, receiver) = mpsc::sync_channel::<Job>(1);
        let own = crate::peer::own_uid();
        let thread = std::thread::Builder::new().name("migration".into()).spawn(move || {
            if let Err(e) = filter.install() {
                log::error!("the migration thread cannot confine itself: {e}");
                return;
            }
            while let Ok(job) = receiver.recv() {
                run(job, &vm, &mem, own);
            }
        })?;
        Ok(Sender { jobs: Some(jobs), thread: Some(thread) })
    }

    /// Hand the thread a job.
    pub fn start(&self, job: Job) -> Result<(), MigrationError> {
        self.jobs
            .as_ref()
            .ok_or(MigrationError::ThreadGone)?
            .send(job)
            .map_err(|_| MigrationError::ThreadGone)
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One RAM region as KVM knows it.
struct Slot {
    index: u32,
    gpa: u64,
    len: u64,
    host: u64,
}

fn slots(mem: &GuestMemoryMmap) -> Vec<Slot> {
    mem.iter()
        .enumerate()
        .map(|(i, r)| Slot {
            index: u32::try_from(i).unwrap_or(u32::MAX),
            gpa: r.start_addr().0,
            len: r.len(),
            host: r.as_ptr() as u64,
        })
        .collect()
}

/// Switch KVM's dirty logging on or off for every slot (the same mapping, other flags).
fn kvm_logging(vm: &VmFd, slots: &[Slot], on: bool) -> Result<(), MigrationError> {
    for slot in slots {
        let region = kvm_userspace_memory_region {
            slot: slot.index,
            flags: if on { KVM_MEM_LOG_DIRTY_PAGES } else { 0 },
            guest_phys_addr: slot.gpa,
            memory_size: slot.len,
            userspace_addr: slot.host,
        };
        // SAFETY: the same slot, guest range and host mapping the VM was built with (owned by
        // the VM's guest memory, which outlives this thread); only the flags change.
        unsafe { vm.set_user_memory_region(region) }.map_err(|source| MigrationError::Kvm {
            what: if on { "start dirty logging" } else { "stop dirty logging" },
            source,
        })?;
    }
    Ok(())
}

/// The pages to send: one bitmap per slot (bit `i`: the slot's page `i`).
struct Dirty {
    maps: Vec<Vec<u64>>,
}

/// What one round sent.
struct Sent {
    pages: u64,
    kvm: u64,
    device: u64,
}

struct Stream<'a> {
    out: Out,
    mem: &'a GuestMemoryMmap,
    bytes: u64,
    /// Where a run of pages is copied on its way into a TCP connection's buffer.
    copy: Vec<u8>,
}

impl Stream<'_> {
    /// Send the `pages` pages at `gpa` (inside one region): on a Unix socket straight from
    /// guest memory, on TCP through the connection's buffer (and TLS's records).
    fn run(&mut self, gpa: u64, pages: u32) -> Result<(), MigrationError> {
        wire::write_pages_header(&mut self.out, gpa, pages)?;
        let len =
            usize::try_from(u64::from(pages) * PAGE).map_err(|_| MigrationError::Stream("run".into()))?;
        let sending = |e: vm_memory::GuestMemoryError| MigrationError::Io {
            what: "sending pages",
            source: std::io::Error::other(e),
        };
        match &mut self.out {
            Out::Unix(socket) => {
                self.mem.write_all_volatile_to(GuestAddress(gpa), socket, len).map_err(sending)?;
            }
            Out::Buffered(buffer) => {
                self.copy.resize(len, 0);
                self.mem.read_slice(&mut self.copy, GuestAddress(gpa)).map_err(sending)?;
                buffer
                    .write_all(&self.copy)
                    .map_err(|source| MigrationError::Io { what: "sending pages", source })?;
            }
        }
        self.bytes += 13 + u64::from(pages) * PAGE;
        Ok(())
    }

    /// Send the pages set in `dirty`, in runs of consecutive pages; with `skip_zero`, pages
    /// that read as zero are left out (the destination's memory starts zeroed). Pages sent.
    fn send(&mut self, slots: &[Slot], dirty: &Dirty, skip_zero: bool) -> Result<u64, MigrationError> {
        let mut sent = 0;
        let mut page = vec![0u8; usize::try_from(PAGE).unwrap_or(4096)];
        for (slot, map) in slots.iter().zip(&dirty.maps) {
            let pages = slot.len / PAGE;
            let mut run: Option<(u64, u32)> = None;
            for i in 0..pages {
                let set = map
                    .get(usize::try_from(i / 64).unwrap_or(usize::MAX))
                    .is_some_and(|w| w >> (i % 64) & 1 != 0);
                let gpa = slot.gpa + i * PAGE;
                let wanted = set
                    && !(skip_zero
                        && self.mem.read_slice(&mut page, GuestAddress(gpa)).is_ok()
                        && page.iter().all(|&b| b == 0));
                run = match (run, wanted) {
                    (Some((start, n)), true) if n < MAX_RECORD_PAGES => Some((start, n + 1)),
                    (Some((start, n)), true) => {
                        self.run(start, n)?;
                        sent += u64::from(n);
                        Some((gpa, 1))
                    }
                    (None, true) => Some((gpa, 1)),
                    (Some((start, n)), false) => {
                        self.run(start, n)?;
                        sent += u64::from(n);
                        None
                    }
                    (None, false) => None,
                };
            }
            if let Some((start, n)) = run {
                self.run(start, n)?;
                sent += u64::from(n);
            }
        }
        Ok(sent)
    }
}

/// Read and clear KVM's dirty log and the devices' into one set; how many pages each reported.
fn collect(vm: &VmFd, slots: &[Slot], device_log: &DirtyBitmap) -> Result<(Dirty, u64, u64), MigrationError> {
    let mut maps = Vec::with_capacity(slots.len());
    let mut kvm = 0;
    for slot in slots {
        let len = usize::try_from(slot.len).map_err(|_| MigrationError::Unsupported("slot size".into()))?;
        let map = vm
            .get_dirty_log(slot.index, len)
            .map_err(|source| MigrationError::Kvm { what: "read the dirty log", source })?;
        kvm += map.iter().map(|w| u64::from(w.count_ones())).sum::<u64>();
        maps.push(map);
    }
    let mut device = 0;
    device_log.take(|gpa| {
        device += 1;
        if let Some((slot, map)) =
            slots.iter().zip(maps.iter_mut()).find(|(s, _)| gpa >= s.gpa && gpa - s.gpa < s.len)
        {
            let page = (gpa - slot.gpa) / PAGE;
            if let Some(word) = map.get_mut(usize::try_from(page / 64).unwrap_or(usize::MAX)) {
                *word |= 1 << (page % 64);
            }
        }
    });
    Ok((Dirty { maps }, kvm, device))
}

fn round(stream: &mut Stream, vm: &VmFd, slots: &[Slot], log: &DirtyBitmap) -> Result<Sent, MigrationError> {
    let (dirty, kvm, device) = collect(vm, slots, log)?;
    let pages = stream.send(slots, &dirty, false)?;
    Ok(Sent { pages, kvm, device })
}

fn run(job: Job, vm: &VmFd, mem: &GuestMemoryMmap, own: u32) {
    let started = Instant::now();
    let slots = slots(mem);
    let mut report = MigrationReport::default();
    let mut logging = false;
    let outcome = precopy(&job, (vm, mem, own), &slots, &mut report, &mut logging);
    let outcome = match outcome {
        Err(e) => {
            let _ = job.steps.send(Step::Converged(Err(e)));
            Err(None)
        }
        Ok(mut stream) => {
            let _ = job.steps.send(Step::Converged(Ok(())));
            match job.finish.recv() {
                Ok(Some(state)) => {
                    stop_and_copy(&mut stream, vm, &slots, &job.device_log, &state, &mut report).map_err(Some)
                }
                // The pause failed (or the main thread went): the source goes on.
                _ => Err(None),
            }
        }
    };
    if logging && outcome.is_err() {
        if let Err(e) = kvm_logging(vm, &slots, false) {
            log::warn!("{e}");
        }
    }
    report.total_ms = started.elapsed().as_secs_f64() * 1e3;
    match outcome {
        Ok(()) => {
            let _ = job.steps.send(Step::Done(Ok(report)));
        }
        Err(Some(e)) => {
            let _ = job.steps.send(Step::Done(Err(e)));
        }
        Err(None) => {}
    }
}

/// Connect (to a peer of this process's uid or root only on a Unix socket; to one whose TLS
/// certificate the CA signed on TCP), say hello, and copy memory while the guest runs until a
/// round sends few pages.
fn precopy<'a>(
    job: &Job,
    (vm, mem, own): (&VmFd, &'a GuestMemoryMmap, u32),
    slots: &[Slot],
    report: &mut MigrationReport,
    logging: &mut bool,
) -> Result<Stream<'a>, MigrationError> {
    let out = transport::connect(&job.url, job.tls.as_deref(), own)?;
    let mut stream = Stream { out, mem, bytes: 0, copy: Vec::new() };
    wire::write_hello(&mut stream.out, &job.hello)?;
    stream.out.flush().map_err(|source| MigrationError::Io { what: "sending the hello", source })?;
    wire::read_reply(&mut stream.out.replies()?, "waiting for the destination to build the VM")?;
    kvm_logging(vm, slots, true)?;
    *logging = true;
    // Round 0: all of memory (its zero pages left out), with both logs on, so a page written
    // from now on is sent again.
    let all = Dirty {
        maps: slots
            .iter()
            .map(|s| vec![u64::MAX; usize::try_from(s.len.div_ceil(PAGE * 64)).unwrap_or(0)])
            .collect(),
    };
    let first = stream.send(slots, &all, true)?;
    report.pages_per_round.push(first);
    report.rounds = 1;
    while report.rounds < MAX_ROUNDS {
        let sent = round(&mut stream, vm, slots, &job.device_log)?;
        report.rounds += 1;
        report.pages_per_round.push(sent.pages);
        report.kvm_dirty_pages += sent.kvm;
        report.device_dirty_pages += sent.device;
        if sent.pages <= CONVERGED_PAGES {
            break;
        }
    }
    stream.out.flush().map_err(|source| MigrationError::Io { what: "sending pages", source })?;
    Ok(stream)
}

/// The VM is paused: send the pages dirtied since the last round, then the state, and wait for
/// the destination to take it.
fn stop_and_copy(
    stream: &mut Stream,
    vm: &VmFd,
    slots: &[Slot],
    log: &DirtyBitmap,
    state: &[u8],
    report: &mut MigrationReport,
) -> Result<(), MigrationError> {
    let started = Instant::now();
    let last = round(stream, vm, slots, log)?;
    report.final_pages = last.pages;
    report.pages_per_round.push(last.pages);
    report.kvm_dirty_pages += last.kvm;
    report.device_dirty_pages += last.device;
    wire::write_state(&mut stream.out, state)?;
    stream.bytes += 5 + state.len() as u64;
    report.state_bytes = state.len() as u64;
    report.bytes = stream.bytes;
    let sent = Instant::now();
    report.final_send_ms = (sent - started).as_secs_f64() * 1e3;
    let replied =
        wire::read_reply(&mut stream.out.replies()?, "waiting for the destination to resume the VM");
    report.destination_ms = sent.elapsed().as_secs_f64() * 1e3;
    replied
}
