//! QEMU-KVM as a peer VMM: boots the same probe guest with `-M microvm`.

pub mod qmp;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum QemuError {
    #[error("cannot start {binary}: {source}")]
    Spawn { binary: PathBuf, source: std::io::Error },
    #[error("QEMU did not finish within {0:?}")]
    Timeout(Duration),
    #[error("QEMU failed (status {status:?}): {stderr}")]
    Failed { status: Option<i32>, stderr: String },
    #[error("QMP: {0}")]
    Qmp(String),
}

/// What a finished QEMU run of the probe did not deliver.
#[derive(Debug, Error)]
pub enum ProbeError {
    /// The probe printed no result line.
    #[error("the probe printed no result (status {0})")]
    NoResult(u8),
    /// The probe printed its result line but exited with a failure status.
    #[error("the probe exited with status {status}: {line}")]
    Status { status: u8, line: serde_json::Value },
    /// No QMP sample was taken at this mark.
    #[error("no sample at mark {0}")]
    NoSample(u32),
}

/// A CPU that `sched_setaffinity` cannot name.
#[derive(Debug, Error)]
#[error("CPU {0} is beyond what sched_setaffinity takes")]
pub struct CpuOutOfRange(pub usize);

/// A mark the guest printed (`probe.mark_linger_ms`), with QEMU's vCPU exit counters and the
/// CPU time of QEMU (and any helper processes) sampled while the guest lingered.
pub struct PeerMark {
    pub label: u32,
    pub at: Instant,
    pub stats: Vec<(String, u64)>,
    pub cpu: Duration,
    /// Bytes of the mark's console line: each one cost an exit (the probe writes COM1 directly).
    pub line_bytes: u64,
}

pub struct Qemu {
    pub binary: PathBuf,
    /// First line of `--version`.
    pub version: String,
}

/// One finished QEMU run.
pub struct QemuRun {
    pub stdout: String,
    /// The value the guest wrote to isa-debug-exit (QEMU exits with `(V << 1) | 1`).
    pub guest_status: u8,
    pub command_line: String,
}

impl Qemu {
    /// `$EXITLESS_QEMU` or `qemu-system-x86_64` from PATH, if it runs.
    pub fn find() -> Option<Qemu> {
        let binary =
            std::env::var_os("EXITLESS_QEMU").map_or_else(|| "qemu-system-x86_64".into(), PathBuf::from);
        let output = Command::new(&binary).arg("--version").output().ok()?;
        let version = String::from_utf8_lossy(&output.stdout).lines().next()?.trim().to_string();
        output.status.success().then_some(Qemu { binary, version })
    }

    /// The arguments that boot `kernel` the way exitless does: `machine` (microvm and its
    /// options), KVM, COM1 on stdio and the isa-debug-exit port.
    pub fn probe_args(machine: &str, kernel: &Path, cmdline: &str, mem_mib: u64) -> Vec<String> {
        [
            "-M",
            machine,
            "-accel",
            "kvm",
            "-m",
            &format!("{mem_mib}M"),
            "-smp",
            "1",
            "-nographic",
            "-nodefaults",
            "-no-reboot",
            "-serial",
            "stdio",
            "-device",
            "isa-debug-exit,iobase=0xf4,iosize=1",
            "-kernel",
            &kernel.display().to_string(),
            "-append",
            cmdline,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// Boot the probe ELF at `kernel` with `cmdline` and wait for it to exit.
    pub fn run_probe(&self, kernel: &Path, cmdline: &str, timeout: Duration) -> Result<QemuRun, QemuError> {
        self.run_marked(&Self::probe_args("microvm", kernel, cmdline, 256), None, &[], timeout)
            .map(|(run, _)| run)
    }
}

impl Qemu {
    /// Boot with `args`, reading the console as it comes, and wait for the guest to exit. With a
    /// QMP socket path `qmp`: at every mark line the guest prints, sample QEMU's exit counters
    /// and the CPU time of QEMU and of `helpers` (e.g. a vhost-user backend).
    pub fn run_marked(
        &self,
        args: &[String],
        qmp: Option<&Path>,
        helpers: &[u32],
        timeout: Duration,
    ) -> Result<(QemuRun, Vec<PeerMark>), QemuError> {
        self.run_marked_with(args, qmp, helpers, timeout, |_| {})
    }

    /// [`Qemu::run_marked`], calling `spawned` with QEMU's process id as soon as it runs (to pin
    /// its threads or watch its CPU time).
    pub fn run_marked_with(
        &self,
        args: &[String],
        qmp: Option<&Path>,
        helpers: &[u32],
        timeout: Duration,
        spawned: impl FnOnce(u32),
    ) -> Result<(QemuRun, Vec<PeerMark>), QemuError> {
        self.run_marked_sampling(args, qmp, &[], helpers, timeout, spawned)
    }

    /// [`Qemu::run_marked_with`], also adding to each mark's exit counters those of the QEMUs
    /// already running with QMP sockets `others` (the other VM of a VM-to-VM transaction).
    pub fn run_marked_sampling(
        &self,
        args: &[String],
        qmp: Option<&Path>,
        others: &[&Path],
        helpers: &[u32],
        timeout: Duration,
        spawned: impl FnOnce(u32),
    ) -> Result<(QemuRun, Vec<PeerMark>), QemuError> {
        let mut args = args.to_vec();
        if let Some(qmp) = qmp {
            args.extend(["-qmp".to_string(), format!("unix:{},server=on,wait=off", qmp.display())]);
        }
        let command_line = format!("{} {}", self.binary.display(), shell_words(&args));
        let spawn_error = |source| QemuError::Spawn { binary: self.binary.clone(), source };
        let mut child = Command::new(&self.binary)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_error)?;
        let pid = child.id();
        spawned(pid);
        let mut stderr = child.stderr.take().expect("piped stderr");
        let err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watchdog = {
            let done = done.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    if started.elapsed() > timeout {
                        // SAFETY: kill(2) has no memory effects; `pid` is our child, which is
                        // not reaped before this thread is joined (see `wait_without_reaping`),
                        // so the pid cannot name another process.
                        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                        return true;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                false
            })
        };
        let mut stdout = String::new();
        let mut marks = Vec::new();
        // Connected now, while the guest boots: at a mark the sample is then one round trip, not
        // three, inside the guest's linger (a busy host made connecting there miss it).
        let mut qmp_client = qmp.and_then(|qmp| connect_early(qmp, pid));
        let mut other_clients = Vec::new();
        let mut sample_error: Option<QemuError> = None;
        for line in BufReader::new(child.stdout.take().expect("piped stdout")).lines() {
            let Ok(line) = line else { break };
            if let Some((label, qmp)) = mark_label(&line).zip(qmp) {
                let at = Instant::now();
                let sample = (|| {
                    if qmp_client.is_none() {
                        qmp_client = Some(qmp::Qmp::connect(qmp)?);
                    }
                    if other_clients.is_empty() {
                        other_clients =
                            others.iter().map(|path| qmp::Qmp::connect(path)).collect::<Result<_, _>>()?;
                    }
                    let mut stats = qmp_client.as_mut().expect("connected above").vcpu_stats()?;
                    for other in &mut other_clients {
                        for (name, value) in other.vcpu_stats()? {
                            match stats.iter_mut().find(|(n, _)| *n == name) {
                                Some((_, sum)) => *sum += value,
                                None => stats.push((name, value)),
                            }
                        }
                    }
                    Ok::<_, QemuError>(stats)
                })();
                match sample {
                    Ok(stats) => {
                        let cpu =
                            std::iter::once(pid).chain(helpers.iter().copied()).map(process_cpu_time).sum();
                        marks.push(PeerMark { label, at, stats, cpu, line_bytes: line.len() as u64 + 1 });
                    }
                    Err(e) => sample_error = Some(e),
                }
            }
            stdout.push_str(&line);
            stdout.push('\n');
        }
        wait_without_reaping(pid);
        done.store(true, std::sync::atomic::Ordering::Release);
        let timed_out = watchdog.join().unwrap_or(false);
        let status = child.wait().map_err(spawn_error)?;
        if timed_out {
            return Err(QemuError::Timeout(timeout));
        }
        let stderr = err.join().unwrap_or_default();
        if let Some(e) = sample_error {
            // What QEMU said as it went, if it went: the sample's error alone hides why.
            let ended = format!("{e}; QEMU then ended with status {:?}: {}", status.code(), stderr.trim());
            return Err(QemuError::Qmp(ended));
        }
        match status.code() {
            Some(code) if code & 1 == 1 && !stdout.is_empty() => {
                Ok((QemuRun { stdout, guest_status: (code >> 1) as u8, command_line }, marks))
            }
            code => Err(QemuError::Failed { status: code, stderr: stderr.trim().to_string() }),
        }
    }
}

/// Wait until child `pid` has exited, leaving it to be reaped (its pid stays ours until then).
fn wait_without_reaping(pid: u32) {
    exited(pid, true);
}

/// Whether child `pid` has exited, looked at without reaping it (its pid stays ours until
/// `Child::wait`); with `block`, waits until it has.
fn exited(pid: u32, block: bool) -> bool {
    let flags = libc::WEXITED | libc::WNOWAIT | if block { 0 } else { libc::WNOHANG };
    loop {
        // SAFETY: an all-zero siginfo_t is a valid out-value for waitid, which fills it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid on our own child with a valid out-pointer; WNOWAIT leaves it unreaped.
        if unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, flags) } == 0 {
            // SAFETY: waitid filled `info`; si_pid stays 0 when WNOHANG found it running.
            return unsafe { info.si_pid() } != 0;
        }
        // ECHILD: nothing left to wait for; EINTR: ask again.
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return true;
        }
    }
}

/// Connects to QEMU's QMP socket at `path` as soon as QEMU listens there (within 10 s, while
/// child `pid` runs: looked at without reaping it); `None` if it did not, and the first mark
/// tries again.
fn connect_early(path: &Path, pid: u32) -> Option<qmp::Qmp> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && !exited(pid, false) {
        if let Ok(client) = qmp::Qmp::connect(path) {
            return Some(client);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// `{"mark":N}` → N.
fn mark_label(line: &str) -> Option<u32> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    value.as_object().filter(|o| o.len() == 1)?.get("mark")?.as_u64()?.try_into().ok()
}

/// Make `command`'s child run on host CPU `cpu` only (a peer's daemon pinned where the IOCore
/// would be).
pub fn pin_child(command: &mut Command, cpu: usize) -> Result<(), CpuOutOfRange> {
    use std::os::unix::process::CommandExt;
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(CpuOutOfRange(cpu));
    }
    // SAFETY: the closure runs in the child between fork and exec and only calls
    // sched_setaffinity on a CPU set on its own stack: async-signal-safe, no allocation.
    unsafe {
        command.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    Ok(())
}

/// Puts QEMU's vCPU thread (`CPU 0/KVM`) on `vcpu_cpu` and every other thread on `io_cpu`, once
/// the vCPU thread is there (at most 10 s; QEMU makes it before the guest runs). Until then the
/// whole process starts up on `vcpu_cpu` (threads inherit the main thread's CPU): on `io_cpu`
/// its start-up work held a vhost-user daemon's idle-class IOCore off that CPU for over 50 ms,
/// and the IOCore went back to being a batch thread for the run. QEMU names its threads only
/// when run with `-name ...,debug-threads=on`.
pub fn pin_threads(pid: u32, vcpu_cpu: usize, io_cpu: usize) {
    set_affinity(pid, vcpu_cpu);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return };
        let threads: Vec<(u32, bool)> = tasks
            .flatten()
            .filter_map(|task| {
                let tid = task.file_name().to_str()?.parse::<u32>().ok()?;
                let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
                Some((tid, comm.starts_with("CPU ") && comm.contains("/KVM")))
            })
            .collect();
        if threads.iter().any(|&(_, is_vcpu)| is_vcpu) {
            for (tid, is_vcpu) in threads {
                set_affinity(tid, if is_vcpu { vcpu_cpu } else { io_cpu });
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// sched_setaffinity of one thread to one CPU (errors ignored: the thread may have ended).
fn set_affinity(tid: u32, cpu: usize) {
    if cpu >= libc::CPU_SETSIZE as usize {
        return;
    }
    // SAFETY: cpu_set_t is plain old data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (checked above), so CPU_SET stays inside `set`; `set` is
    // a valid cpu_set_t of the size passed to sched_setaffinity, which reads nothing else.
    unsafe {
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(tid as libc::pid_t, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// The probe's `blk` result line from a QEMU run, which must have ended with status OK.
pub fn blk_result(run: &QemuRun) -> Result<serde_json::Value, ProbeError> {
    let line = crate::blk_result(&run.stdout).ok_or(ProbeError::NoResult(run.guest_status))?;
    if run.guest_status != probe_abi::status::OK {
        return Err(ProbeError::Status { status: run.guest_status, line });
    }
    Ok(line)
}

/// User plus system CPU time of process `pid` (all its threads); zero if it is gone.
pub fn process_cpu_time(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return Duration::ZERO };
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { return Duration::ZERO };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11..13).map_or(0, |f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum());
    // SAFETY: sysconf has no memory-safety preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_nanos(ticks * 1_000_000_000 / per_second)
}

/// Arguments joined for display, quoted where they hold spaces.
pub fn shell_words(args: &[String]) -> String {
    args.iter()
        .map(|a| if a.contains(' ') || a.is_empty() { format!("'{a}'") } else { a.clone() })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Name and allowed CPUs (`Cpus_allowed_list`) of each thread of process `pid`.
    fn thread_cpus(pid: u32) -> Vec<(String, String)> {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process is there");
        tasks
            .flatten()
            .map(|task| {
                let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
                let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
                let cpus =
                    status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap_or_default();
                (comm.trim().to_string(), cpus.trim().to_string())
            })
            .collect()
    }

    #[test]
    fn qemus_vcpu_thread_goes_to_the_vcpu_cpu_and_its_other_threads_to_the_io_cpu() {
        let qemu = Qemu::find().expect("QEMU must be installed (the README's test command installs it)");
        // Stopped (-S): QEMU makes its vCPU thread, which never runs a guest.
        let mut child = Command::new(&qemu.binary)
            .args([
                "-M",
                "microvm",
                "-accel",
                "kvm",
                "-m",
                "64M",
                "-smp",
                "1",
                "-nodefaults",
                "-display",
                "none",
            ])
            .args(["-S", "-name", "pin-test,debug-threads=on"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("QEMU starts");
        pin_threads(child.id(), 0, 1);
        let threads = thread_cpus(child.id());
        let _ = child.kill();
        let _ = child.wait();

        let (vcpus, others): (Vec<_>, Vec<_>) = threads.iter().partition(|(name, _)| name == "CPU 0/KVM");
        assert_eq!(vcpus.len(), 1, "one vCPU thread: {threads:?}");
        assert_eq!(vcpus[0].1, "0", "the vCPU thread on CPU 0: {threads:?}");
        assert!(!others.is_empty(), "QEMU's other threads: {threads:?}");
        assert!(others.iter().all(|(_, cpus)| cpus == "1"), "every other thread on CPU 1: {threads:?}");
    }
}
