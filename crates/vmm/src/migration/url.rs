//! Where a migration goes or comes from: `unix:/PATH`, `tcp:IP:PORT` (mutual TLS) or
//! `tcp+plain:IP:PORT` (unencrypted and unauthenticated, only when asked for by that name).

use std::net::SocketAddr;
use std::path::PathBuf;

use super::MigrationError;

/// A parsed `destination_url` (vm.send-migration) or `--receive-migration` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigrationUrl {
    /// `unix:/PATH`: a Unix socket on this host, its peer checked by uid (SO_PEERCRED).
    Unix(PathBuf),
    /// `tcp:IP:PORT` (`tls`: mutual TLS, certificates from `--migration-tls-dir`) or
    /// `tcp+plain:IP:PORT` (no TLS). The host is an IP address, never a name: a name would be
    /// resolved on a confined thread (files, sockets to a resolver) and a resolver could be lied
    /// to; the TLS certificate names that address.
    Tcp {
        /// The destination's IP address and port.
        addr: SocketAddr,
        /// Mutual TLS (`tcp:`), or none (`tcp+plain:`).
        tls: bool,
    },
}

/// What the URL forms are, for error messages.
pub const URL_FORMS: &str = "unix:/PATH, tcp:IP:PORT (mutual TLS) or tcp+plain:IP:PORT (no TLS)";

impl MigrationUrl {
    /// Parse `url`; anything else than the three forms is an error that names them.
    pub fn parse(url: &str) -> Result<MigrationUrl, MigrationError> {
        let bad = || MigrationError::Url(url.to_string());
        if let Some(path) = url.strip_prefix("unix:") {
            return match path.starts_with('/') && !path.contains('\0') {
                true => Ok(MigrationUrl::Unix(PathBuf::from(path))),
                false => Err(bad()),
            };
        }
        let (address, tls) = match (url.strip_prefix("tcp:"), url.strip_prefix("tcp+plain:")) {
            (Some(address), _) => (address, true),
            (None, Some(address)) => (address, false),
            (None, None) => return Err(bad()),
        };
        // `SocketAddr` takes `1.2.3.4:5` and `[::1]:5`, and nothing with a name, a missing
        // port, a zone or spaces.
        let addr: SocketAddr = address.parse().map_err(|_| bad())?;
        if addr.port() == 0 {
            return Err(bad());
        }
        Ok(MigrationUrl::Tcp { addr, tls })
    }

    /// A TCP URL without TLS: refused unless its scheme says so (`tcp+plain:`).
    pub fn is_plain_tcp(&self) -> bool {
        matches!(self, MigrationUrl::Tcp { tls: false, .. })
    }
}

impl std::fmt::Display for MigrationUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MigrationUrl::Unix(path) => write!(f, "unix:{}", path.display()),
            MigrationUrl::Tcp { addr, tls: true } => write!(f, "tcp:{addr}"),
            MigrationUrl::Tcp { addr, tls: false } => write!(f, "tcp+plain:{addr}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_forms_parse_and_anything_else_is_refused() {
        assert_eq!(
            MigrationUrl::parse("unix:/run/m.sock").unwrap(),
            MigrationUrl::Unix("/run/m.sock".into())
        );
        let tcp = MigrationUrl::parse("tcp:10.213.0.2:7000").unwrap();
        assert_eq!(tcp, MigrationUrl::Tcp { addr: "10.213.0.2:7000".parse().unwrap(), tls: true });
        assert!(!tcp.is_plain_tcp());
        assert_eq!(tcp.to_string(), "tcp:10.213.0.2:7000");
        let plain = MigrationUrl::parse("tcp+plain:0.0.0.0:7000").unwrap();
        assert!(plain.is_plain_tcp());
        assert_eq!(plain.to_string(), "tcp+plain:0.0.0.0:7000");
        let v6 = MigrationUrl::parse("tcp:[fd00::2]:443").unwrap();
        assert_eq!(v6, MigrationUrl::Tcp { addr: "[fd00::2]:443".parse().unwrap(), tls: true });
        assert_eq!(v6.to_string(), "tcp:[fd00::2]:443");
        for bad in [
            "",
            "unix:",
            "unix:relative/path",
            "unix:/a\0b",
            "file:///tmp/x",
            "tcp:",
            "tcp:10.0.0.1",
            "tcp:10.0.0.1:",
            "tcp:10.0.0.1:0",
            "tcp:10.0.0.1:65536",
            "tcp:10.0.0.1:70000",
            "tcp:host.example:7000",
            "tcp:localhost:7000",
            "tcp::::7000",
            "tcp:fd00::2:443",
            "tcp: 10.0.0.1:7000",
            "tcp:10.0.0.1:7000 ",
            "tcp:10.0.0.256:7000",
            "tcp+tls:10.0.0.1:7000",
            "TCP:10.0.0.1:7000",
            "tcp+plain:",
            "tcp+plain:[::1]",
        ] {
            let error = MigrationUrl::parse(bad).unwrap_err().to_string();
            assert!(error.contains("tcp+plain:IP:PORT"), "{bad:?}: {error}");
        }
    }
}
