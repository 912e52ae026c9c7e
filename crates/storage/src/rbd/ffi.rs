//! The part of librados' and librbd's C API (Ceph 16, `rados/librados.h` and `rbd/librbd.h`)
//! that exitless calls, loaded at run time.
//!
//! Why a small hand-written module rather than bindgen or a crate: exitless calls 19 functions
//! whose signatures have been stable since Ceph 14; bindgen would need libclang on every build
//! machine for them, and no maintained crate covers librbd's asynchronous calls. Why loaded at
//! run time (`dlopen`, as QEMU's `block-rbd` module is): exitless then starts, and serves every
//! other kind of disk, on a host without Ceph's client libraries, and librbd's static
//! initialisers run only in processes that open an RBD image.

use std::ffi::{c_char, c_int, c_void};

use libloading::Library;

/// `rados_t`: a cluster connection.
pub type Rados = *mut c_void;
/// `rados_ioctx_t`: a pool of a connection.
pub type Ioctx = *mut c_void;
/// `rbd_image_t`: an open image.
pub type Image = *mut c_void;
/// `rbd_completion_t`: one asynchronous request's completion.
pub type Completion = *mut c_void;
/// `rbd_callback_t`: called by one of librbd's threads when a request completes.
pub type Callback = unsafe extern "C" fn(completion: Completion, arg: *mut c_void);

/// The functions, resolved from librados.so.2 and librbd.so.1.
pub struct Librbd {
    pub rados_create2: unsafe extern "C" fn(*mut Rados, *const c_char, *const c_char, u64) -> c_int,
    pub rados_conf_read_file: unsafe extern "C" fn(Rados, *const c_char) -> c_int,
    pub rados_conf_set: unsafe extern "C" fn(Rados, *const c_char, *const c_char) -> c_int,
    pub rados_connect: unsafe extern "C" fn(Rados) -> c_int,
    pub rados_shutdown: unsafe extern "C" fn(Rados),
    pub rados_ioctx_create: unsafe extern "C" fn(Rados, *const c_char, *mut Ioctx) -> c_int,
    pub rados_ioctx_destroy: unsafe extern "C" fn(Ioctx),
    pub rbd_open: unsafe extern "C" fn(Ioctx, *const c_char, *mut Image, *const c_char) -> c_int,
    pub rbd_open_read_only: unsafe extern "C" fn(Ioctx, *const c_char, *mut Image, *const c_char) -> c_int,
    pub rbd_close: unsafe extern "C" fn(Image) -> c_int,
    pub rbd_get_size: unsafe extern "C" fn(Image, *mut u64) -> c_int,
    pub rbd_aio_create_completion:
        unsafe extern "C" fn(*mut c_void, Option<Callback>, *mut Completion) -> c_int,
    pub rbd_aio_release: unsafe extern "C" fn(Completion),
    pub rbd_aio_get_return_value: unsafe extern "C" fn(Completion) -> isize,
    pub rbd_aio_wait_for_complete: unsafe extern "C" fn(Completion) -> c_int,
    pub rbd_aio_readv: unsafe extern "C" fn(Image, *const libc::iovec, c_int, u64, Completion) -> c_int,
    pub rbd_aio_writev: unsafe extern "C" fn(Image, *const libc::iovec, c_int, u64, Completion) -> c_int,
    pub rbd_aio_flush: unsafe extern "C" fn(Image, Completion) -> c_int,
    pub rbd_aio_discard: unsafe extern "C" fn(Image, u64, u64, Completion) -> c_int,
    pub rbd_aio_write_zeroes: unsafe extern "C" fn(Image, u64, usize, Completion, c_int, c_int) -> c_int,
    /// Keeps the libraries mapped for as long as the functions above may be called.
    _libraries: (Library, Library),
}

/// The libraries' file names (Debian's librados2 and librbd1).
pub const LIBRADOS: &str = "librados.so.2";
pub const LIBRBD: &str = "librbd.so.1";

impl Librbd {
    /// Load both libraries and resolve every function.
    pub fn load() -> Result<Librbd, libloading::Error> {
        // SAFETY: loading runs the libraries' initialisers, which are Ceph's own and have no
        // preconditions; every symbol below is given the type its C header declares.
        unsafe {
            let rados = Library::new(LIBRADOS)?;
            let rbd = Library::new(LIBRBD)?;
            Ok(Librbd {
                rados_create2: *rados.get(b"rados_create2\0")?,
                rados_conf_read_file: *rados.get(b"rados_conf_read_file\0")?,
                rados_conf_set: *rados.get(b"rados_conf_set\0")?,
                rados_connect: *rados.get(b"rados_connect\0")?,
                rados_shutdown: *rados.get(b"rados_shutdown\0")?,
                rados_ioctx_create: *rados.get(b"rados_ioctx_create\0")?,
                rados_ioctx_destroy: *rados.get(b"rados_ioctx_destroy\0")?,
                rbd_open: *rbd.get(b"rbd_open\0")?,
                rbd_open_read_only: *rbd.get(b"rbd_open_read_only\0")?,
                rbd_close: *rbd.get(b"rbd_close\0")?,
                rbd_get_size: *rbd.get(b"rbd_get_size\0")?,
                rbd_aio_create_completion: *rbd.get(b"rbd_aio_create_completion\0")?,
                rbd_aio_release: *rbd.get(b"rbd_aio_release\0")?,
                rbd_aio_get_return_value: *rbd.get(b"rbd_aio_get_return_value\0")?,
                rbd_aio_wait_for_complete: *rbd.get(b"rbd_aio_wait_for_complete\0")?,
                rbd_aio_readv: *rbd.get(b"rbd_aio_readv\0")?,
                rbd_aio_writev: *rbd.get(b"rbd_aio_writev\0")?,
                rbd_aio_flush: *rbd.get(b"rbd_aio_flush\0")?,
                rbd_aio_discard: *rbd.get(b"rbd_aio_discard\0")?,
                rbd_aio_write_zeroes: *rbd.get(b"rbd_aio_write_zeroes\0")?,
                _libraries: (rados, rbd),
            })
        }
    }
}
