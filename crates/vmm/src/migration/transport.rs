//! The connection a migration stream goes over: a Unix socket on this host (its peer checked by
//! uid), or TCP between hosts, with mutual TLS 1.3 (rustls, ring's cryptography) unless the URL
//! says `tcp+plain:`.
//!
//! Mutual TLS: each end has a certificate and key, both signed by a CA the other trusts. They
//! come from one directory per host ([`MigrationTls::load`], `run --migration-tls-dir DIR`):
//! `ca.pem` (the CA certificates this host trusts), `cert.pem` (this host's certificate chain)
//! and `key.pem` (its private key, mode 0600). The destination refuses a source whose
//! certificate the CA did not sign, or that has none, before it reads a byte of the stream; the
//! source refuses a destination whose certificate the CA did not sign, or that does not name the
//! IP address it connected to (subjectAltName), before it sends a byte of the VM.
//!
//! Every handshake runs on the thread that carries the stream, under its seccomp filter: the
//! source's `migration` thread, the destination's `state-reader` thread.

use std::io::{BufReader, BufWriter, IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    AlertDescription, CertificateError, ClientConfig, ClientConnection, RootCertStore, ServerConfig,
};
use rustls::{ServerConnection, StreamOwned};

use super::url::MigrationUrl;
use super::{MigrationError, PEER_TIMEOUT};

/// The CA certificates this host trusts (PEM), in the TLS directory.
pub const CA_FILE: &str = "ca.pem";
/// This host's certificate, then any intermediate CA certificates (PEM).
pub const CERT_FILE: &str = "cert.pem";
/// This host's private key (PEM: PKCS#8, PKCS#1 or SEC1), readable by its owner only.
pub const KEY_FILE: &str = "key.pem";

/// How long a TCP connect, or a TLS handshake, may take: a stranger that connects to the
/// destination and says nothing holds it up no longer than this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How much the sender buffers before a write: many pages, and TLS records of 16 KiB each, go
/// out in one system call.
const SEND_BUFFER: usize = 1 << 20;
/// How much of a TCP connection is read at once (rustls asks for 4 KiB at a time).
const RECEIVE_BUFFER: usize = 1 << 20;

/// Mutual TLS for migrations over TCP: this host's certificate and key, and the CA it trusts
/// the other host's certificate to be signed by.
pub struct MigrationTls {
    dir: PathBuf,
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
}

impl std::fmt::Debug for MigrationTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MigrationTls").field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl MigrationTls {
    /// Read `dir`'s `ca.pem`, `cert.pem` and `key.pem` (the operator's files, read before any
    /// thread is confined) into a TLS 1.3 client (the source's side) and server (the
    /// destination's, which asks every client for a certificate signed by the CA).
    pub fn load(dir: &Path) -> Result<MigrationTls, MigrationError> {
        let refused = |name: &str, reason: String| MigrationError::TlsFiles { path: dir.join(name), reason };
        let certificates = |name: &str| -> Result<Vec<CertificateDer<'static>>, MigrationError> {
            let certs = CertificateDer::pem_file_iter(dir.join(name))
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| refused(name, pem_error(&e)))?;
            match certs.is_empty() {
                true => {
                    Err(refused(name, "it holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into()))
                }
                false => Ok(certs),
            }
        };
        let mut roots = RootCertStore::empty();
        for ca in certificates(CA_FILE)? {
            roots
                .add(ca)
                .map_err(|e| refused(CA_FILE, format!("not a CA certificate rustls can use: {e}")))?;
        }
        let roots = Arc::new(roots);
        let chain = certificates(CERT_FILE)?;
        check_private(&dir.join(KEY_FILE)).map_err(|reason| refused(KEY_FILE, reason))?;
        let key =
            PrivateKeyDer::from_pem_file(dir.join(KEY_FILE)).map_err(|e| refused(KEY_FILE, pem_error(&e)))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let versions = [&rustls::version::TLS13];
        let internal = |e: rustls::Error| refused(CERT_FILE, e.to_string());
        let mismatch = |e: rustls::Error| refused(CERT_FILE, format!("it does not go with {KEY_FILE}: {e}"));
        let client = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)
            .map_err(internal)?
            .with_root_certificates(roots.clone())
            .with_client_auth_cert(chain.clone(), key.clone_key())
            .map_err(mismatch)?;
        let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| refused(CA_FILE, e.to_string()))?;
        let server = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&versions)
            .map_err(internal)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(mismatch)?;
        Ok(MigrationTls { dir: dir.to_path_buf(), client: Arc::new(client), server: Arc::new(server) })
    }

    /// The directory the files came from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

fn pem_error(e: &rustls::pki_types::pem::Error) -> String {
    match e {
        rustls::pki_types::pem::Error::Io(e) => e.to_string(),
        other => format!("not PEM: {other:?}"),
    }
}

/// A private key must be a regular file that no other user may read or write.
fn check_private(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    let mode = meta.permissions().mode() & 0o777;
    match (meta.is_file(), mode & 0o077) {
        (false, _) => Err("not a regular file".into()),
        (true, 0) => Ok(()),
        (true, _) => Err(format!("other users may read or write it (mode {mode:03o}); chmod 600 it")),
    }
}

/// A TCP connection whose reads go through a buffer (rustls reads 4 KiB at a time: one system
/// call each without it) and whose writes go straight to the socket.
pub(crate) struct Socket {
    reads: BufReader<TcpStream>,
}

impl Socket {
    fn new(tcp: TcpStream) -> Socket {
        Socket { reads: BufReader::with_capacity(RECEIVE_BUFFER, tcp) }
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.reads.read(buf)
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.reads.get_ref().write(buf)
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        self.reads.get_ref().write_vectored(bufs)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Which end a TLS error was seen from, for its message.
#[derive(Clone, Copy)]
enum Side {
    Source,
    Destination,
}

/// A migration connection, either end.
pub(crate) enum Conn {
    Unix(UnixStream),
    Plain(TcpStream),
    /// The source's side, and its TLS directory (for error messages).
    TlsClient(Box<StreamOwned<ClientConnection, Socket>>, PathBuf),
    /// The destination's side, and its TLS directory.
    TlsServer(Box<StreamOwned<ServerConnection, Socket>>, PathBuf),
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Unix(s) => s.read(buf),
            Conn::Plain(s) => s.read(buf),
            Conn::TlsClient(s, dir) => s.read(buf).map_err(|e| explain(e, Side::Source, dir)),
            Conn::TlsServer(s, dir) => s.read(buf).map_err(|e| explain(e, Side::Destination, dir)),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Unix(s) => s.write(buf),
            Conn::Plain(s) => s.write(buf),
            Conn::TlsClient(s, dir) => s.write(buf).map_err(|e| explain(e, Side::Source, dir)),
            Conn::TlsServer(s, dir) => s.write(buf).map_err(|e| explain(e, Side::Destination, dir)),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Conn::Unix(s) => s.flush(),
            Conn::Plain(s) => s.flush(),
            Conn::TlsClient(s, dir) => s.flush().map_err(|e| explain(e, Side::Source, dir)),
            Conn::TlsServer(s, dir) => s.flush().map_err(|e| explain(e, Side::Destination, dir)),
        }
    }
}

/// An I/O error with rustls's reason inside made into one that says what went wrong.
fn explain(e: std::io::Error, side: Side, dir: &Path) -> std::io::Error {
    match e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        Some(tls) => std::io::Error::new(e.kind(), describe(tls, side, dir)),
        None => e,
    }
}

/// What a TLS failure means, seen from `side`; `dir` (the TLS directory) names the files.
fn describe(error: &rustls::Error, side: Side, dir: &Path) -> String {
    let peer = match side {
        Side::Source => "the destination",
        Side::Destination => "the source",
    };
    let file = |name: &str| dir.join(name).display().to_string();
    let ca = file(CA_FILE);
    match error {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            format!("{peer}'s certificate is not signed by a CA in {ca}")
        }
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => format!(
            "{peer}'s certificate does not name the IP address it was reached at (its subjectAltName must)"
        ),
        rustls::Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        ) => format!("{peer}'s certificate has expired"),
        rustls::Error::InvalidCertificate(other) => format!("{peer}'s certificate is refused: {other:?}"),
        rustls::Error::NoCertificatesPresented => {
            format!("{peer} presented no certificate (both ends need one signed by a CA in {ca})")
        }
        rustls::Error::AlertReceived(
            alert @ (AlertDescription::UnknownCA
            | AlertDescription::BadCertificate
            | AlertDescription::CertificateRequired
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateExpired
            | AlertDescription::AccessDenied),
        ) => format!(
            "{peer} refused this host's certificate (TLS alert {alert:?}): is {} signed by a CA {peer} trusts?",
            file(CERT_FILE)
        ),
        rustls::Error::AlertReceived(alert) => format!("{peer} ended the TLS session (alert {alert:?})"),
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => format!(
            "{peer} does not speak TLS (does it use tcp+plain:? TCP migrations are mutual TLS unless both \
             ends name tcp+plain:)"
        ),
        other => format!("TLS with {peer} failed: {other}"),
    }
}

/// Connect to the destination `url` names and, before a byte of the VM goes, make sure of who
/// it is: a Unix socket's listener must be this uid (`own`) or root; a TCP destination must
/// complete a TLS handshake with a certificate the CA in `tls` signed for its address (unless
/// the URL is `tcp+plain:`). Waits are bounded (`PEER_TIMEOUT`).
pub(crate) fn connect(
    url: &MigrationUrl,
    tls: Option<&MigrationTls>,
    own: u32,
) -> Result<Out, MigrationError> {
    match url {
        MigrationUrl::Unix(path) => {
            let socket = |what| {
                let path = path.clone();
                move |source| MigrationError::Socket { what, path, source }
            };
            let conn = UnixStream::connect(path).map_err(socket("connect to"))?;
            // Before a byte goes: whoever bound the path first (in a world-writable directory,
            // any local user) would get the VM's configuration and memory, and could end it.
            let peer = crate::peer::peer_uid(&conn).map_err(socket("ask who listens on"))?;
            if !crate::peer::trusted_peer(peer, own) {
                return Err(MigrationError::UntrustedPeer { path: path.clone(), peer, own });
            }
            conn.set_read_timeout(Some(PEER_TIMEOUT)).map_err(socket("set a timeout on"))?;
            conn.set_write_timeout(Some(PEER_TIMEOUT)).map_err(socket("set a timeout on"))?;
            Ok(Out::Unix(conn))
        }
        &MigrationUrl::Tcp { addr, tls: wants_tls } => {
            let tcp_error = |what| move |source| MigrationError::Tcp { what, addr, source };
            let tcp =
                TcpStream::connect_timeout(&addr, HANDSHAKE_TIMEOUT).map_err(tcp_error("connect to"))?;
            // Pages go out in large buffered writes; the small last ones (the state) must not
            // wait for an acknowledgement.
            tcp.set_nodelay(true).map_err(tcp_error("set TCP_NODELAY on"))?;
            tcp.set_read_timeout(Some(PEER_TIMEOUT)).map_err(tcp_error("set a timeout on"))?;
            tcp.set_write_timeout(Some(PEER_TIMEOUT)).map_err(tcp_error("set a timeout on"))?;
            let conn = match (wants_tls, tls) {
                (false, _) => Conn::Plain(tcp),
                (true, None) => return Err(MigrationError::NeedsTls { url: url.to_string() }),
                (true, Some(tls)) => {
                    let name = ServerName::IpAddress(addr.ip().into());
                    let mut client = ClientConnection::new(tls.client.clone(), name)
                        .map_err(|e| MigrationError::Tls { peer: addr, reason: e.to_string() })?;
                    client.set_buffer_limit(Some(SEND_BUFFER));
                    let mut socket = Socket::new(tcp);
                    handshake(&mut client, &mut socket).map_err(|e| MigrationError::Tls {
                        peer: addr,
                        reason: reason(&e, Side::Source, tls),
                    })?;
                    Conn::TlsClient(Box::new(StreamOwned::new(client, socket)), tls.dir.clone())
                }
            };
            Ok(Out::Buffered(BufWriter::with_capacity(SEND_BUFFER, conn)))
        }
    }
}

/// Complete a TLS handshake on `socket`.
fn handshake<D>(conn: &mut rustls::ConnectionCommon<D>, socket: &mut Socket) -> Result<(), std::io::Error> {
    while conn.is_handshaking() {
        conn.complete_io(socket)?;
    }
    // The last flight (a client's certificate and Finished) goes out now, not with the first
    // bytes of the stream.
    while conn.wants_write() {
        conn.write_tls(socket)?;
    }
    Ok(())
}

/// Why a handshake failed, in words.
fn reason(e: &std::io::Error, side: Side, tls: &MigrationTls) -> String {
    match e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        Some(tls_error) => describe(tls_error, side, &tls.dir),
        None if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            let peer = match side {
                Side::Source => "the destination",
                Side::Destination => "the source",
            };
            format!("{peer} closed the connection during the TLS handshake")
        }
        None if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
            format!("no TLS handshake within {} s", HANDSHAKE_TIMEOUT.as_secs())
        }
        None => e.to_string(),
    }
}

/// The source's side of a connection.
pub(crate) enum Out {
    /// Pages go straight from guest memory to the socket (`write_all_volatile_to`).
    Unix(UnixStream),
    /// TCP, plain or TLS, through a buffer.
    Buffered(BufWriter<Conn>),
}

impl Out {
    /// The connection to read the destination's replies from (everything written is flushed
    /// first).
    pub(crate) fn replies(&mut self) -> Result<&mut dyn Read, MigrationError> {
        self.flush().map_err(|source| MigrationError::Io { what: "sending", source })?;
        Ok(match self {
            Out::Unix(s) => s,
            Out::Buffered(b) => b.get_mut(),
        })
    }
}

impl Write for Out {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Out::Unix(s) => s.write(buf),
            Out::Buffered(b) => b.write(buf),
        }
    }
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match self {
            Out::Unix(s) => s.write_all(buf),
            Out::Buffered(b) => b.write_all(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Out::Unix(s) => s.flush(),
            Out::Buffered(b) => b.flush(),
        }
    }
}

/// The destination's listening socket, bound by the main thread before the reader starts.
pub(crate) enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Listener {
    /// Listen where `url` says: a Unix socket made 0600 from its first moment
    /// (`super::listen_private`), or a TCP port.
    pub(crate) fn bind(url: &MigrationUrl) -> Result<Listener, MigrationError> {
        match url {
            MigrationUrl::Unix(path) => Ok(Listener::Unix(super::listen_private(path)?)),
            &MigrationUrl::Tcp { addr, .. } => TcpListener::bind(addr)
                .map(Listener::Tcp)
                .map_err(|source| MigrationError::Tcp { what: "listen on", addr, source }),
        }
    }
}

/// Accept connections until one comes from a source this host trusts: on a Unix socket, a
/// process of this uid (`own`) or root; on TCP with `tls`, a peer that completes the handshake
/// with a certificate the CA signed; on `tcp+plain:`, the first to connect. The others are
/// closed, each logged with why, and the wait goes on. The connection, and how many were
/// refused.
pub(crate) fn accept(
    listener: &Listener,
    own: u32,
    tls: Option<&MigrationTls>,
) -> Result<(Conn, u64), MigrationError> {
    let accepting = |source| MigrationError::Io { what: "accepting a source", source };
    let mut refused = 0;
    loop {
        let why = match listener {
            Listener::Unix(listener) => {
                let (conn, _) = listener.accept().map_err(accepting)?;
                match crate::peer::peer_uid(&conn) {
                    Ok(peer) if crate::peer::trusted_peer(peer, own) => {
                        return set_timeouts(&conn).map(|()| (Conn::Unix(conn), refused))
                    }
                    Ok(peer) => format!("from uid {peer} (only uid {own} or root may send a VM here)"),
                    Err(e) => format!("whose sender cannot be known ({e})"),
                }
            }
            Listener::Tcp(listener) => {
                let (tcp, from) = listener.accept().map_err(accepting)?;
                match accept_tcp(tcp, tls) {
                    Ok(conn) => return Ok((conn, refused)),
                    Err(why) => format!("from {from}: {why}"),
                }
            }
        };
        log::warn!("refused a migration connection {why}; still waiting for the source");
        refused += 1;
    }
}

fn set_timeouts(conn: &UnixStream) -> Result<(), MigrationError> {
    conn.set_read_timeout(Some(PEER_TIMEOUT))
        .and_then(|()| conn.set_write_timeout(Some(PEER_TIMEOUT)))
        .map_err(|source| MigrationError::Io { what: "setting up the connection", source })
}

/// Set up an accepted TCP connection and, with `tls`, complete the handshake (within
/// `HANDSHAKE_TIMEOUT`); why not, in words.
fn accept_tcp(tcp: TcpStream, tls: Option<&MigrationTls>) -> Result<Conn, String> {
    tcp.set_nodelay(true).map_err(|e| format!("cannot set TCP_NODELAY: {e}"))?;
    let timeouts = |tcp: &TcpStream, limit| {
        tcp.set_read_timeout(Some(limit))
            .and_then(|()| tcp.set_write_timeout(Some(limit)))
            .map_err(|e| format!("cannot set a timeout: {e}"))
    };
    let Some(tls) = tls else {
        timeouts(&tcp, PEER_TIMEOUT)?;
        return Ok(Conn::Plain(tcp));
    };
    timeouts(&tcp, HANDSHAKE_TIMEOUT)?;
    let mut server = ServerConnection::new(tls.server.clone()).map_err(|e| e.to_string())?;
    let mut socket = Socket::new(tcp);
    handshake(&mut server, &mut socket).map_err(|e| reason(&e, Side::Destination, tls))?;
    timeouts(socket.reads.get_ref(), PEER_TIMEOUT)?;
    Ok(Conn::TlsServer(Box::new(StreamOwned::new(server, socket)), tls.dir.clone()))
}
