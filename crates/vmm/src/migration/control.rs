//! `VmControl::send_migration`: the VMM main thread's part of a live migration. It switches the
//! devices' dirty logging on, hands the sending thread its job, pauses the VM when pre-copy has
//! converged and hands over the VM's state; on success the VM ends here (it runs on at the
//! destination), on failure it is resumed and logs nothing any more.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::send::{Job, Step};
use super::wire::Hello;
use super::{DirtyBitmap, MigrationError, MigrationReport};
use crate::vm::{ControlError, Ending, VmControl};

/// How often the main thread, waiting for the sending thread, looks whether the VM ended.
const WAIT_TICK: Duration = Duration::from_millis(5);

impl VmControl<'_> {
    /// Migrate the running VM live to the exitless waiting on `url` (`unix:/PATH`,
    /// `tcp:IP:PORT` with mutual TLS, or `tcp+plain:IP:PORT`; started with
    /// `run --receive-migration`). On success the VM ends here with `Ending::Migrated`; on
    /// failure it goes on running here. What the migration took.
    pub fn send_migration(&self, url: &str) -> Result<MigrationReport, ControlError> {
        let started = Instant::now();
        if self.paused() {
            return Err(MigrationError::Unsupported("the VM is paused; resume it first".into()).into());
        }
        let vm = self.vm;
        let parsed = super::MigrationUrl::parse(url)?;
        let tls = match &parsed {
            super::MigrationUrl::Tcp { tls: true, .. } => {
                Some(vm.migration_tls.clone().ok_or(MigrationError::NeedsTls { url: url.to_string() })?)
            }
            _ => None,
        };
        let config = vm.saved_config.clone().map_err(MigrationError::Unsupported)?;
        if !config.vhost_user_nets.is_empty() {
            // The daemon would have to log the pages it writes (LOG_SHMFD) into the sender's log.
            let why =
                "live migration of a VM with a NIC on a vhost-user daemon is not supported yet (a snapshot \
                       and restore is)";
            return Err(MigrationError::Unsupported(why.into()).into());
        }
        let sender = self.migration.ok_or(MigrationError::ThreadGone)?;
        let memory_bytes = crate::vm::host_ranges(&vm.mem).iter().map(|r| r.1).sum();
        let covers = crate::vm::host_ranges(&vm.mem).iter().map(|r| r.0 + r.1).max().unwrap_or(0);
        let bitmap = Arc::new(DirtyBitmap::new(covers));
        self.device_logging(Some(&bitmap))?;
        let (steps, step) = mpsc::sync_channel(2);
        let (finish, finished) = mpsc::sync_channel(1);
        let job = Job {
            url: parsed,
            tls,
            hello: Hello { config, memory_bytes },
            device_log: bitmap,
            steps,
            finish: finished,
        };
        let outcome = sender.start(job).and_then(|()| match self.wait(&step)? {
            Step::Converged(converged) => converged,
            Step::Done(_) => Err(MigrationError::ThreadGone),
        });
        if let Err(e) = outcome {
            self.device_logging(None).ok();
            return Err(e.into());
        }
        // Stop-and-copy: the downtime starts here.
        let paused = Instant::now();
        let mut pause_ms = 0.0;
        let state = self.pause().map_err(|e| e.to_string()).and_then(|took| {
            pause_ms = took.as_secs_f64() * 1e3;
            let state = vm.state().map_err(|e| e.to_string())?;
            serde_json::to_vec(&state).map_err(|e| e.to_string())
        });
        let done = match state {
            Ok(state) => {
                let _ = finish.send(Some(state));
                self.wait(&step).and_then(|step| match step {
                    Step::Done(done) => done,
                    Step::Converged(_) => Err(MigrationError::ThreadGone),
                })
            }
            Err(why) => {
                let _ = finish.send(None);
                Err(MigrationError::Unsupported(format!("cannot pause and read the VM: {why}")))
            }
        };
        match done {
            Ok(mut report) => {
                report.downtime_ms = paused.elapsed().as_secs_f64() * 1e3;
                report.pause_ms = pause_ms;
                report.total_ms = started.elapsed().as_secs_f64() * 1e3;
                vm.control.end(Ending::Migrated(url.to_string()));
                Ok(report)
            }
            Err(e) => {
                self.device_logging(None).ok();
                if self.paused() {
                    self.resume()?;
                }
                Err(e.into())
            }
        }
    }

    /// Is a migration's dirty logging on?
    pub(crate) fn migrating(&self) -> bool {
        self.vm.migrating.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Switch every device's dirty logging into `bitmap` on, or off (`None`); on error, all off.
    /// The test device's responder, whose writes no log sees, is held while the log is on.
    fn device_logging(&self, bitmap: Option<&Arc<DirtyBitmap>>) -> Result<(), ControlError> {
        self.vm.migrating.store(bitmap.is_some(), std::sync::atomic::Ordering::Release);
        if let Some(testdev) = &self.vm.bus.testdev {
            match bitmap {
                Some(_) => testdev.hold(),
                None if !self.paused() => testdev.release(),
                None => {}
            }
        }
        for slot in &self.vm.bus.virtio.slots {
            let log = bitmap.map(|b| b.log());
            let switched = crate::vm::lock(&slot.transport).set_dirty_log(log);
            if let Err(source) = switched {
                if bitmap.is_some() {
                    self.device_logging(None).ok();
                }
                let error = crate::snapshot::SnapshotError::Device {
                    kind: slot.kind.to_string(),
                    index: slot.index,
                    source,
                };
                return Err(error.into());
            }
        }
        Ok(())
    }

    /// The sending thread's next step; an error if the thread went or the VM ended.
    fn wait(&self, step: &Receiver<Step>) -> Result<Step, MigrationError> {
        loop {
            match step.recv_timeout(WAIT_TICK) {
                Ok(step) => return Ok(step),
                Err(RecvTimeoutError::Disconnected) => return Err(MigrationError::ThreadGone),
                Err(RecvTimeoutError::Timeout)
                    if self.vm.control.stop.load(std::sync::atomic::Ordering::Acquire) =>
                {
                    return Err(MigrationError::VmEnded)
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }
}
