//! Connecting to a cluster, opening an image and closing it again, all on one thread of their
//! own, the RBD client thread.
//!
//! librados and librbd start their own threads (messengers, timers, finishers) from the thread
//! that connects, and those threads inherit its seccomp filter and its CPUs. Connecting from a
//! thread that the owner's [`set_up_client_threads`] has placed and confined puts every one of
//! librbd's threads on those CPUs and under that filter. Closing happens there too, so that
//! librbd's shut-down calls run under the same filter rather than under whichever filter the
//! thread that dropped the last queue's backend had.

use std::ffi::CString;
use std::path::PathBuf;
use std::sync::{mpsc, Mutex, OnceLock};

use super::ffi::{self, Librbd};
use super::{RbdError, RbdSpec};

/// What the RBD client thread runs once librbd is loaded and before it starts any thread: its
/// CPUs, then its seccomp filter.
pub type ClientSetUp = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

static SET_UP: OnceLock<ClientSetUp> = OnceLock::new();

/// Have the RBD client thread, and so every thread librbd starts, run `set_up` first. Call it
/// before the first RBD disk opens; later calls, and calls after that, change nothing (`false`).
pub fn set_up_client_threads(set_up: ClientSetUp) -> bool {
    SET_UP.set(set_up).is_ok()
}

type Job = Box<dyn FnOnce(Result<&'static Librbd, &RbdError>) + Send>;

/// The client thread's queue of jobs, started with the first.
static CLIENT: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();

/// Start the RBD client thread now, load librbd and confine the thread: for an owner that may
/// open an RBD image only once its own threads are confined (a daemon's control API adds disks
/// from a confined thread, and a thread started from there would be held to that thread's
/// filter too). Otherwise the thread starts with the first image opened.
pub fn start_client_thread() -> Result<(), RbdError> {
    on_client_thread(|_| Ok(()))
}

/// Run `job` on the RBD client thread and wait for its answer.
pub(super) fn on_client_thread<T: Send + 'static>(
    job: impl FnOnce(&'static Librbd) -> Result<T, RbdError> + Send + 'static,
) -> Result<T, RbdError> {
    let (reply, answer) = mpsc::sync_channel(1);
    let job: Job = Box::new(move |library| {
        let _ = reply.send(library.map_err(RbdError::clone).and_then(job));
    });
    send(job)?;
    answer.recv().map_err(|_| RbdError::ClientThreadGone)?
}

fn send(job: Job) -> Result<(), RbdError> {
    let client = CLIENT.get_or_init(|| {
        let (jobs, queue) = mpsc::channel::<Job>();
        let started = std::thread::Builder::new().name("rbd-client".into()).spawn(move || serve(&queue));
        if let Err(error) = started {
            // Every job sent to this queue fails with ClientThreadGone; say why once.
            eprintln!("exitless: cannot start the RBD client thread: {error}");
        }
        Mutex::new(jobs)
    });
    let jobs = client.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    jobs.send(job).map_err(|_| RbdError::ClientThreadGone)
}

fn serve(queue: &mpsc::Receiver<Job>) {
    // Loaded before the filter, which allows no executable mapping; librbd starts no thread
    // until it connects.
    let library = Librbd::load()
        .map(|library| &*Box::leak(Box::new(library)))
        .map_err(|e| RbdError::Library(e.to_string()))
        .and_then(|library| match SET_UP.get().map_or(Ok(()), |set_up| set_up()) {
            Ok(()) => Ok(library),
            Err(reason) => Err(RbdError::SetUp(reason)),
        });
    for job in queue {
        job(library.as_ref().copied());
    }
}

/// An open image and the connection it came through, shared by the backends of a disk's queues
/// (one image handle per disk: a second handle in the same process would be a second owner of
/// the image's exclusive lock, and the two would take it from each other on every write).
pub struct Connection {
    pub(super) library: &'static Librbd,
    rados: ffi::Rados,
    ioctx: ffi::Ioctx,
    pub(super) image: ffi::Image,
    /// The image's size in bytes.
    pub(super) capacity: u64,
}

// SAFETY: librados' and librbd's handles may be used from any thread, and librbd's calls on one
// image from several threads at once (Ceph documents both libraries as thread-safe; QEMU and
// fio's rbd engine submit from several threads). The handles stay valid until `Drop` closes
// them, which needs `&mut self`, so no other reference exists then.
unsafe impl Send for Connection {}
// SAFETY: as above.
unsafe impl Sync for Connection {}

impl Connection {
    /// Connect to the cluster `spec` names and open its image; on the RBD client thread only.
    pub(super) fn open(library: &'static Librbd, spec: &RbdSpec) -> Result<Connection, RbdError> {
        connect(library, spec)
    }
}

impl Drop for Connection {
    /// Close the image and the connection, and wait until they are: closing releases the
    /// image's exclusive lock, which the next client (this host's next process, or the
    /// destination of a migration) would otherwise wait for until the cluster times this one
    /// out (30 s and more).
    fn drop(&mut self) {
        let handles =
            Handles { library: self.library, rados: self.rados, ioctx: self.ioctx, image: self.image };
        let (reply, closed) = mpsc::sync_channel(1);
        // rbd_close waits for what librbd still does for the image and joins its threads.
        let close: Job = Box::new(move |_| {
            handles.close();
            let _ = reply.send(());
        });
        match send(close) {
            Ok(()) => {
                let _ = closed.recv();
            }
            Err(error) => eprintln!("exitless: cannot close an RBD image: {error}"),
        }
    }
}

/// A connection's handles on their way to the client thread to be closed.
struct Handles {
    library: &'static Librbd,
    rados: ffi::Rados,
    ioctx: ffi::Ioctx,
    image: ffi::Image,
}

// SAFETY: see `Connection`; the handles are used only by the thread they are sent to.
unsafe impl Send for Handles {}

impl Handles {
    fn close(self) {
        let lib = self.library;
        // SAFETY: each handle was opened by `connect` and is closed here once, the image first;
        // null ones were never opened.
        unsafe {
            if !self.image.is_null() {
                (lib.rbd_close)(self.image);
            }
            if !self.ioctx.is_null() {
                (lib.rados_ioctx_destroy)(self.ioctx);
            }
            if !self.rados.is_null() {
                (lib.rados_shutdown)(self.rados);
            }
        }
    }
}

fn c_string(what: &str, text: &str) -> Result<CString, RbdError> {
    CString::new(text).map_err(|_| RbdError::Nul(what.into()))
}

/// Settings exitless gives librbd whatever the configuration file says.
const FORCED_SETTINGS: [(&str, &str); 4] = [
    // The write-around cache acknowledges writes before the cluster has them: an acknowledged
    // write must survive this process (as QEMU's cache.direct=on). So a FLUSH has nothing to
    // do (`RbdDisk::submit`).
    ("rbd_cache", "false"),
    // Nor may a plugin cache writes (the persistent write log acknowledges writes in a local
    // log, before the cluster has them).
    ("rbd_plugins", ""),
    // Otherwise a discard of part of an object leaves its data: discarded blocks read as zeros,
    // as on every other exitless disk.
    ("rbd_skip_partial_discard", "false"),
    // No admin socket: exitless makes no socket another user could reach (docs/security.md);
    // its own metrics say what the disk does.
    ("admin_socket", ""),
];

fn connect(library: &'static Librbd, spec: &RbdSpec) -> Result<Connection, RbdError> {
    let lib = library;
    let name = c_string("id", &format!("client.{}", spec.user()))?;
    let cluster = c_string("cluster", "ceph")?;
    let conf = spec.conf.as_ref().map(|c| c_string("conf", &c.display().to_string())).transpose()?;
    let pool = c_string("pool", &spec.pool)?;
    let image = c_string("image", &spec.image)?;
    let mut handles = Handles {
        library,
        rados: std::ptr::null_mut(),
        ioctx: std::ptr::null_mut(),
        image: std::ptr::null_mut(),
    };
    let fail = |handles: Handles, error: RbdError| {
        handles.close();
        Err(error)
    };
    // SAFETY: the out-pointer is valid; the strings are NUL-terminated and live through the call.
    let rc = unsafe { (lib.rados_create2)(&mut handles.rados, cluster.as_ptr(), name.as_ptr(), 0) };
    if rc < 0 {
        return fail(handles, RbdError::Connect { spec: spec.to_string(), errno: -rc });
    }
    // A cluster that is not there fails the open after this long, not librados' 300 s.
    if let Err(error) = set(lib, handles.rados, "client_mount_timeout", "10") {
        return fail(handles, error);
    }
    // SAFETY: `rados` is a created handle; a null path makes librados look in its usual places.
    let rc = unsafe {
        (lib.rados_conf_read_file)(handles.rados, conf.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()))
    };
    if rc < 0 {
        let conf = spec.conf.clone().unwrap_or_else(|| PathBuf::from("/etc/ceph/ceph.conf"));
        return fail(handles, RbdError::Conf { conf, errno: -rc });
    }
    for (option, value) in FORCED_SETTINGS {
        if let Err(error) = set(lib, handles.rados, option, value) {
            return fail(handles, error);
        }
    }
    // SAFETY: `rados` is a configured handle.
    let rc = unsafe { (lib.rados_connect)(handles.rados) };
    if rc < 0 {
        return fail(handles, RbdError::Connect { spec: spec.to_string(), errno: -rc });
    }
    // SAFETY: `rados` is connected; the out-pointer is valid.
    let rc = unsafe { (lib.rados_ioctx_create)(handles.rados, pool.as_ptr(), &mut handles.ioctx) };
    if rc < 0 {
        return fail(handles, RbdError::Pool { pool: spec.pool.clone(), errno: -rc });
    }
    let open = if spec.read_only { lib.rbd_open_read_only } else { lib.rbd_open };
    // SAFETY: `ioctx` is open; the out-pointer is valid; a null snapshot name is the image head.
    let rc = unsafe { open(handles.ioctx, image.as_ptr(), &mut handles.image, std::ptr::null()) };
    if rc < 0 {
        return fail(handles, RbdError::Image { spec: spec.to_string(), errno: -rc });
    }
    let mut capacity = 0;
    // SAFETY: `image` is open; the out-pointer is valid.
    let rc = unsafe { (lib.rbd_get_size)(handles.image, &mut capacity) };
    if rc < 0 {
        return fail(handles, RbdError::Image { spec: spec.to_string(), errno: -rc });
    }
    if capacity == 0 || !capacity.is_multiple_of(crate::SECTOR_SIZE) {
        return fail(handles, RbdError::Size { spec: spec.to_string(), size: capacity });
    }
    let Handles { rados, ioctx, image, .. } = handles;
    Ok(Connection { library, rados, ioctx, image, capacity })
}

fn set(lib: &Librbd, rados: ffi::Rados, option: &str, value: &str) -> Result<(), RbdError> {
    let (name, text) = (c_string("option", option)?, c_string("option", value)?);
    // SAFETY: `rados` is a created handle; both strings are NUL-terminated.
    let rc = unsafe { (lib.rados_conf_set)(rados, name.as_ptr(), text.as_ptr()) };
    if rc < 0 {
        return Err(RbdError::Option { option: option.into(), errno: -rc });
    }
    Ok(())
}
