//! The backend matrix's `rbd` disk: an image on a Ceph cluster. Without `--ceph-conf` the bench
//! starts a throw-away cluster of its own with the repository's `scripts/ceph.sh` (one monitor,
//! one BlueStore OSD on a file in the scratch directory, pool `rbd`, cephx), on this host and so
//! on the CPUs the guest set-up uses, and takes it down when the disk is dropped: at the end of
//! its runs, on an error, on a panic; a bench killed outright leaves it to `ceph.sh up
//! --until-exit`'s watcher, which takes it down once the bench process has gone. With
//! `--ceph-conf FILE` the image goes into that cluster's pool `rbd` as `client.admin`, and is
//! removed at the end.
//!
//! The image is created with the `layering` feature alone: no exclusive lock, which a holder
//! killed without closing the image (the vhost-user backends are killed after each run, and
//! QEMU's guest ends it with `exit()`) would keep until the cluster timed it out, 30 s and more,
//! while the next run's first write waited for it. It is written through before the first run
//! (`rbd bench`, sequential 4 MiB writes), so reads read data the OSD holds.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;
use storage::RbdSpec;
use thiserror::Error;

/// The pool the image goes into, in the bench's cluster and in a `--ceph-conf` cluster.
pub const POOL: &str = "rbd";

/// Why the bench has no RBD image to measure.
#[derive(Debug, Error)]
pub enum CephError {
    #[error(
        "--backends rbd starts a throw-away Ceph cluster with scripts/ceph.sh, found neither above \
         this exitless ({exe}) nor in the tree it was built from ({built}); run exitless from its \
         repository (target/release/exitless), or name an existing cluster with --ceph-conf FILE"
    )]
    NoScript { exe: String, built: PathBuf },
    #[error("{tool} is missing: run scripts/setup.sh (it installs ceph-mon, ceph-osd and ceph-common)")]
    MissingTool { tool: &'static str },
    #[error("--ceph-conf {}: {source}", conf.display())]
    Conf {
        conf: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("scripts/ceph.sh up {} failed ({status}): {message}", dir.display())]
    Up { dir: PathBuf, status: String, message: String },
    #[error("`{command}` failed ({status}): {message}")]
    Rbd { command: String, status: String, message: String },
}

/// Where the bench's cluster comes from, decided before any run so that a missing script or
/// file ends the bench at once, not after the other backends' runs.
#[derive(Clone, Debug)]
pub enum Source {
    /// A throw-away cluster started by `script` in `dir`.
    Own { script: PathBuf, dir: PathBuf },
    /// An existing cluster's configuration file (`--ceph-conf`).
    Given(PathBuf),
}

impl Source {
    /// `--ceph-conf FILE` if given (it must be readable); otherwise the repository's
    /// `scripts/ceph.sh`, to start a cluster in `scratch_dir`.
    pub fn resolve(ceph_conf: Option<&Path>, scratch_dir: &Path) -> Result<Source, CephError> {
        if let Some(conf) = ceph_conf {
            std::fs::File::open(conf).map_err(|source| CephError::Conf { conf: conf.into(), source })?;
            return Ok(Source::Given(conf.into()));
        }
        let script = script()?;
        for tool in ["ceph-mon", "ceph-osd", "ceph", "rbd"] {
            if !on_path(tool) {
                return Err(CephError::MissingTool { tool });
            }
        }
        let dir = scratch_dir.join(format!("exitless-bench-ceph-{}", std::process::id()));
        Ok(Source::Own { script, dir })
    }
}

/// `scripts/ceph.sh` of the repository the running exitless belongs to: above its executable
/// (`target/release/exitless`), or else in the source tree it was built from.
fn script() -> Result<PathBuf, CephError> {
    const SCRIPT: &str = "scripts/ceph.sh";
    let exe = std::env::current_exe().ok();
    if let Some(found) =
        exe.iter().flat_map(|exe| exe.ancestors().skip(1)).map(|dir| dir.join(SCRIPT)).find(|p| p.is_file())
    {
        return Ok(found);
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(SCRIPT);
    if built.is_file() {
        return Ok(built);
    }
    let exe = exe.map_or_else(|| "its path unknown".into(), |exe| exe.display().to_string());
    Err(CephError::NoScript { exe, built })
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
}

/// One of the cluster's daemons on this host, as the report shows it.
#[derive(Clone, Debug, Serialize)]
pub struct Daemon {
    /// `osd.0`, `mon.a`.
    pub name: String,
    pub pid: u32,
    /// The CPUs it may run on (`Cpus_allowed_list`, as when the cluster came up).
    pub cpus: String,
}

/// What the report says about the cluster (`--json`: `ceph`).
#[derive(Clone, Debug, Serialize)]
pub struct ClusterInfo {
    /// Started by the bench (and taken down by it), or named by `--ceph-conf`.
    pub started_by_bench: bool,
    pub conf: PathBuf,
    /// Its daemons on this host (the bench's own cluster's; none for a `--ceph-conf` cluster,
    /// whose daemons the bench does not know).
    pub daemons: Vec<Daemon>,
    pub image: String,
    /// The CPUs librbd's threads in the bench's own process (exitless's VMM rows) may run on:
    /// those of the RBD client thread, which starts them; `None` before it ran.
    pub librbd_cpus: Option<String>,
}

/// A cluster the bench uses: its own (taken down when dropped) or a given one.
pub struct Cluster {
    conf: PathBuf,
    /// The bench's own cluster: the script and its directory.
    own: Option<(PathBuf, PathBuf)>,
    daemons: Vec<Daemon>,
}

impl Cluster {
    /// Starts the cluster `source` names (a given one is only checked to be there, by the
    /// image's creation).
    pub fn start(source: &Source) -> Result<Cluster, CephError> {
        let (script, dir) = match source {
            Source::Given(conf) => return Ok(Cluster { conf: conf.clone(), own: None, daemons: Vec::new() }),
            Source::Own { script, dir } => (script, dir),
        };
        let output = Command::new(script)
            .arg("up")
            .arg(dir)
            .args(["--until-exit", &std::process::id().to_string()])
            .stdin(Stdio::null())
            .output()
            .map_err(|source| CephError::Spawn { program: script.display().to_string(), source })?;
        // From here on the directory may hold daemons: dropping `cluster` takes them down.
        let mut cluster = Cluster {
            conf: dir.join("ceph.conf"),
            own: Some((script.clone(), dir.clone())),
            daemons: Vec::new(),
        };
        if !output.status.success() {
            let message = last_lines(&output);
            return Err(CephError::Up { dir: dir.clone(), status: output.status.to_string(), message });
        }
        for (name, file) in [("mon.a", "mon.a.pid"), ("osd.0", "osd.0.pid")] {
            let pid =
                std::fs::read_to_string(dir.join("run").join(file)).ok().and_then(|p| p.trim().parse().ok());
            if let Some(pid) = pid {
                cluster.daemons.push(Daemon { name: name.into(), pid, cpus: allowed_cpus(pid) });
            }
        }
        Ok(cluster)
    }

    /// The CPU time the bench's daemons have used so far (none for a given cluster).
    pub fn cpu_time(&self) -> Option<Duration> {
        (!self.daemons.is_empty())
            .then(|| self.daemons.iter().map(|d| crate::qemu::process_cpu_time(d.pid)).sum())
    }

    /// `rbd -c CONF ARGS...`: its standard output.
    fn rbd(&self, args: &[&str]) -> Result<String, CephError> {
        let output = Command::new("rbd")
            .arg("-c")
            .arg(&self.conf)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| CephError::Spawn { program: "rbd".into(), source })?;
        if !output.status.success() {
            let command = format!("rbd -c {} {}", self.conf.display(), args.join(" "));
            return Err(CephError::Rbd {
                command,
                status: output.status.to_string(),
                message: last_lines(&output),
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some((script, dir)) = &self.own {
            let down = Command::new(script).arg("down").arg(dir).stdin(Stdio::null()).output();
            match down {
                Ok(out) if out.status.success() => {}
                Ok(out) => super::progress(format_args!(
                    "cannot take the Ceph cluster in {} down: {}",
                    dir.display(),
                    last_lines(&out)
                )),
                Err(e) => super::progress(format_args!("cannot run {} down: {e}", script.display())),
            }
        }
    }
}

/// Runs `run`, and with the bench's own `cluster` how many cores its daemons used over it: their
/// CPU time over its wall time, start-up and warm-up included.
pub fn cores_during<T>(cluster: Option<&Cluster>, run: impl FnOnce() -> T) -> (T, Option<f64>) {
    let before = cluster.and_then(Cluster::cpu_time);
    let started = Instant::now();
    let result = run();
    let wall = started.elapsed().as_secs_f64();
    let after = cluster.and_then(Cluster::cpu_time);
    let cores = before
        .zip(after)
        .filter(|_| wall > 0.0)
        .map(|(before, after)| after.saturating_sub(before).as_secs_f64() / wall);
    (result, cores)
}

/// A row's note on what [`cores_during`] measured.
pub fn cores_note(cores: Option<f64>) -> Option<String> {
    cores.map(|cores| {
        format!("the cluster's OSD and monitor used {cores:.2} cores over this run (start-up and warm-up included)")
    })
}

/// An image of the bench's, filled with data; removed when dropped (with its cluster, if the
/// bench started that).
pub struct Image {
    pool: &'static str,
    name: String,
    size: u64,
    /// Dropped after the image is removed.
    cluster: Cluster,
}

impl Image {
    /// A new image `rbd/exitless-bench-PID` of `size` bytes on `cluster`, written through.
    pub fn create(cluster: Cluster, size: u64) -> Result<Image, CephError> {
        Image::create_in(cluster, POOL, size)
    }

    fn create_in(cluster: Cluster, pool: &'static str, size: u64) -> Result<Image, CephError> {
        let name = format!("exitless-bench-{}", std::process::id());
        let target = format!("{pool}/{name}");
        let mib = format!("{}M", size >> 20);
        cluster.rbd(&["create", "--size", &mib, "--image-feature", "layering", &target])?;
        // Removed (if the cluster stays) from here on, whatever happens next.
        let image = Image { pool, name, size, cluster };
        super::progress(format_args!(
            "filling the {} MiB RBD image {target} (rbd bench, sequential 4 MiB writes)",
            size >> 20
        ));
        let total = size.to_string();
        image.cluster.rbd(&[
            "bench",
            "--io-type",
            "write",
            "--io-pattern",
            "seq",
            "--io-size",
            "4M",
            "--io-threads",
            "4",
            "--io-total",
            &total,
            &target,
        ])?;
        Ok(image)
    }

    /// The image as exitless opens it (user `admin`).
    pub fn spec(&self) -> RbdSpec {
        RbdSpec {
            pool: self.pool.into(),
            image: self.name.clone(),
            conf: Some(self.cluster.conf.clone()),
            user: None,
            read_only: false,
        }
    }

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// What the report says about the cluster and the image.
    pub fn info(&self) -> ClusterInfo {
        ClusterInfo {
            started_by_bench: self.cluster.own.is_some(),
            conf: self.cluster.conf.clone(),
            daemons: self.cluster.daemons.clone(),
            image: format!("{}/{}", self.pool, self.name),
            librbd_cpus: None,
        }
    }

    /// One line for the disk's description: the image, the cluster and where its daemons run.
    pub fn describe(&self) -> String {
        let cluster = match &self.cluster.own {
            Some((_, dir)) => {
                let daemons: Vec<String> = self
                    .cluster
                    .daemons
                    .iter()
                    .map(|d| format!("{} pid {} on CPUs {}", d.name, d.pid, d.cpus))
                    .collect();
                format!(
                    "a throw-away cluster on this host (scripts/ceph.sh in {}: one monitor, one BlueStore OSD on a \
                     file there, one replica; {}, not pinned: they share the guest set-up's CPUs)",
                    dir.display(),
                    daemons.join(", ")
                )
            }
            None => format!("the cluster of --ceph-conf {}", self.cluster.conf.display()),
        };
        format!(
            "RBD image {}/{} of {} MiB (filled with data, layering only) on {cluster}, through librbd with its \
             cache off",
            self.pool,
            self.name,
            self.size >> 20
        )
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        // The bench's own cluster goes as a whole, its image with it.
        if self.cluster.own.is_none() {
            if let Err(e) =
                self.cluster.rbd(&["rm", "--no-progress", &format!("{}/{}", self.pool, self.name)])
            {
                super::progress(format_args!("cannot remove the bench's RBD image: {e}"));
            }
        }
    }
}

/// The CPUs this process's RBD client thread (`rbd-client`, which starts librbd's threads, and
/// whose CPUs they inherit) may run on, once it runs.
pub fn client_thread_cpus() -> Option<String> {
    std::fs::read_dir("/proc/self/task").ok()?.flatten().find_map(|task| {
        let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
        (comm.trim() == "rbd-client").then(|| {
            let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
            status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map_or("?".into(), |c| c.trim().into())
        })
    })
}

/// `Cpus_allowed_list` of process `pid` (`?` if it cannot be read).
fn allowed_cpus(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).map_or("?".into(), |c| c.trim().into())
}

/// The last lines a failed command printed (standard error, or else standard output), on one line.
fn last_lines(output: &Output) -> String {
    let text = match String::from_utf8_lossy(&output.stderr).trim() {
        "" => String::from_utf8_lossy(&output.stdout).into_owned(),
        err => err.to_string(),
    };
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(3)..].join(" / ");
    if tail.is_empty() {
        "no message".into()
    } else {
        tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive(pid: u32) -> bool {
        Path::new(&format!("/proc/{pid}")).exists()
    }

    /// The bench's own cluster comes up with its daemons known, and goes when its image is
    /// dropped; a failure after it came up (here an image that cannot be made) takes it down
    /// as well.
    #[test]
    fn the_benchs_cluster_goes_down_with_its_image_and_on_a_failure() {
        let scratch = tempfile::tempdir_in("/var/tmp").unwrap();
        let source = Source::resolve(None, scratch.path()).unwrap();
        let Source::Own { dir, .. } = &source else { panic!("{source:?}") };
        let dir = dir.clone();
        let image = Image::create(Cluster::start(&source).unwrap(), 8 << 20).unwrap();
        let daemons = image.info().daemons;
        assert_eq!(daemons.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["mon.a", "osd.0"]);
        assert!(daemons.iter().all(|d| alive(d.pid) && d.cpus != "?"), "{daemons:?}");
        assert!(image.cluster().cpu_time().is_some_and(|t| t > Duration::ZERO));
        assert!(image.describe().contains(&format!("osd.0 pid {}", daemons[1].pid)), "{}", image.describe());
        let listed = image.cluster().rbd(&["ls", POOL]).unwrap();
        assert!(listed.lines().any(|l| l == image.spec().image), "{listed}");
        drop(image);
        assert!(daemons.iter().all(|d| !alive(d.pid)), "the daemons are gone: {daemons:?}");
        assert!(!dir.exists(), "{} is removed", dir.display());

        let cluster = Cluster::start(&source).unwrap();
        let pids: Vec<u32> = cluster.daemons.iter().map(|d| d.pid).collect();
        let failed = Image::create_in(cluster, "no-such-pool", 8 << 20);
        assert!(matches!(failed, Err(CephError::Rbd { .. })), "{:?}", failed.err());
        assert!(pids.iter().all(|&pid| !alive(pid)), "the daemons are gone after the failure");
        assert!(!dir.exists());
    }

    #[test]
    fn a_missing_ceph_conf_is_refused_at_once() {
        let err =
            Source::resolve(Some(Path::new("/nonexistent/ceph.conf")), Path::new("/var/tmp")).unwrap_err();
        assert!(err.to_string().starts_with("--ceph-conf /nonexistent/ceph.conf: "), "{err}");
    }
}
