//! A throw-away Ceph cluster for tests and benchmarks (`scripts/ceph.sh`), one per process,
//! taken down when the process ends.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::command_in;
use crate::RbdSpec;

/// A running cluster: its directory and configuration file.
#[derive(Debug)]
pub struct TestCluster {
    dir: PathBuf,
    conf: PathBuf,
    /// Taken down when dropped (a test's own cluster, not the process's shared one).
    owned: bool,
    /// The network namespace its daemons run in, where `rbd` must run to reach them.
    netns: Option<String>,
}

static CLUSTER: OnceLock<Result<TestCluster, String>> = OnceLock::new();

/// The repository's `scripts/ceph.sh`.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph.sh")
}

impl TestCluster {
    /// This process's cluster, started the first time (about 2 s); it goes down when the
    /// process ends, however it ends. Panics, saying why, when it cannot start.
    pub fn get() -> &'static TestCluster {
        match CLUSTER.get_or_init(TestCluster::start) {
            Ok(cluster) => cluster,
            Err(reason) => panic!("no Ceph cluster for this test: {reason}"),
        }
    }

    /// A cluster of the caller's own, for a test that stops its OSD: taken down when dropped
    /// (or when the process ends).
    pub fn own(name: &str) -> TestCluster {
        TestCluster::own_in(name, None)
    }

    /// As `own`, its daemons in network namespace `netns` bound to `addr` there (`ip netns exec`):
    /// a cluster that other namespaces reach through that address.
    pub fn own_in(name: &str, at: Option<(&str, std::net::Ipv4Addr)>) -> TestCluster {
        let mut cluster =
            TestCluster::start_in(name, at).unwrap_or_else(|reason| panic!("no Ceph cluster: {reason}"));
        cluster.owned = true;
        cluster
    }

    fn start() -> Result<TestCluster, String> {
        TestCluster::start_in("shared", None)
    }

    fn start_in(name: &str, at: Option<(&str, std::net::Ipv4Addr)>) -> Result<TestCluster, String> {
        let base = std::env::var_os("EXITLESS_CEPH_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
        let dir = base.join(format!("exitless-ceph-{}-{name}", std::process::id()));
        let mut command = command_in(at.map(|(netns, _)| netns), script());
        command.arg("up").arg(&dir).args(["--until-exit", &std::process::id().to_string()]);
        if let Some((_, addr)) = at {
            command.args(["--addr", &addr.to_string()]);
        }
        let output = command.output().map_err(|e| format!("cannot run {}: {e}", script().display()))?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() {
            return Err(format!("scripts/ceph.sh up failed ({}): {stderr}", output.status));
        }
        eprint!("{stderr}");
        let conf = dir.join("ceph.conf");
        Ok(TestCluster { dir, conf, owned: false, netns: at.map(|(netns, _)| netns.to_owned()) })
    }

    /// The cluster's configuration file.
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// The cluster's directory (logs, PID files).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Run `rbd` against the cluster with `args`; its stdout, or a panic with its stderr.
    pub fn rbd(&self, args: &[&str]) -> String {
        let output = command_in(self.netns.as_deref(), "rbd")
            .arg("-c")
            .arg(&self.conf)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run rbd: {e}"));
        assert!(output.status.success(), "rbd {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// A new image `rbd/NAME` of `size` bytes, and the spec that opens it.
    pub fn image(&self, name: &str, size: u64) -> RbdSpec {
        self.rbd(&["create", "--size", &format!("{}K", size / 1024), &format!("rbd/{name}")]);
        self.spec(name)
    }

    /// The spec of image `rbd/NAME` as the admin user.
    pub fn spec(&self, name: &str) -> RbdSpec {
        RbdSpec {
            pool: "rbd".into(),
            image: name.into(),
            conf: Some(self.conf.clone()),
            user: None,
            read_only: false,
        }
    }

    /// Kill the OSD (SIGKILL) or start it again.
    pub fn osd(&self, up: bool) {
        self.osd_command(if up { "start-osd" } else { "stop-osd" });
    }

    /// Stop the OSD (SIGSTOP), as a host too busy to run it for a while does, or let it go on
    /// (SIGCONT).
    pub fn pause_osd(&self, paused: bool) {
        self.osd_command(if paused { "pause-osd" } else { "resume-osd" });
    }

    /// `scripts/ceph.sh COMMAND DIR`, which must succeed.
    fn osd_command(&self, command: &str) {
        let status = Command::new(script()).arg(command).arg(&self.dir).status().expect("scripts/ceph.sh");
        assert!(status.success(), "scripts/ceph.sh {command} failed");
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if self.owned {
            let _ = Command::new(script()).arg("down").arg(&self.dir).status();
        }
    }
}
