//! Where the libraries' messages go: they log through the `log` facade, and the binary writes each
//! record to standard error as one line, `PREFIX: message`, like its own messages (the prefix
//! names the process: `exitless`, or `exitless vhost-user-blk` for the daemon). Which records are
//! written is set by `EXITLESS_LOG` (default `info`).
//!
//! A line is formatted into a buffer on the stack and written to fd 2 with one `write(2)`: no
//! allocation, and no system call that a thread confined by its seccomp filter could not make
//! (every filter lets a thread write to standard error, as `eprintln!` did).

use std::fmt;
use std::io::{self, Write};
use std::str::FromStr;

use log::{LevelFilter, Log, Metadata, Record};

/// The environment variable that sets the level.
pub const LEVEL_VAR: &str = "EXITLESS_LOG";

/// The level when `EXITLESS_LOG` is not set.
const DEFAULT_LEVEL: LevelFilter = LevelFilter::Info;

/// A line up to this long is written in one piece (a longer one in pieces this long).
const LINE_BYTES: usize = 1024;

/// Install the logger for a process that calls itself `prefix` in its messages, at the level
/// `EXITLESS_LOG` names. Fails if that is not a level (the message says which are).
pub fn init(prefix: &'static str) -> Result<(), String> {
    let level = match std::env::var(LEVEL_VAR) {
        Err(std::env::VarError::NotPresent) => DEFAULT_LEVEL,
        Ok(value) => LevelFilter::from_str(value.trim()).map_err(|_| {
            format!("{LEVEL_VAR}={value}: not a level (off, error, warn, info, debug, trace)")
        })?,
        Err(std::env::VarError::NotUnicode(value)) => {
            return Err(format!("{LEVEL_VAR}={value:?}: not a level (off, error, warn, info, debug, trace)"))
        }
    };
    // Once per process, so the logger lives as long as the process does.
    let logger: &'static StderrLogger = Box::leak(Box::new(StderrLogger { prefix }));
    log::set_logger(logger).map_err(|e| format!("cannot install the logger: {e}"))?;
    log::set_max_level(level);
    Ok(())
}

/// Writes records to standard error, one line each.
struct StderrLogger {
    prefix: &'static str,
}

impl Log for StderrLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        // Locked for the whole line, so lines of threads logging at once do not interleave.
        // Nothing to do if standard error is gone: the line is lost, as with `eprintln!`.
        let _ = write_line(&mut io::stderr().lock(), self.prefix, record.args());
    }

    fn flush(&self) {}
}

/// Write `prefix: message` and a newline to `out`, in one `write` when it fits in `LINE_BYTES`.
fn write_line(out: &mut impl Write, prefix: &str, message: &fmt::Arguments) -> io::Result<()> {
    let mut line = LineBuffer { out, bytes: [0; LINE_BYTES], len: 0, error: None };
    let formatted = fmt::Write::write_fmt(&mut line, format_args!("{prefix}: {message}\n"));
    match (formatted, line.error.take()) {
        (_, Some(e)) => Err(e),
        (Err(_), None) => Err(io::Error::other("a message's Display failed")),
        (Ok(()), None) => line.flush(),
    }
}

/// A line being formatted, on the stack; written out when full and at its end.
struct LineBuffer<'a, W: Write> {
    out: &'a mut W,
    bytes: [u8; LINE_BYTES],
    len: usize,
    /// The first write that failed (`fmt::Error` cannot carry it).
    error: Option<io::Error>,
}

impl<W: Write> LineBuffer<'_, W> {
    fn flush(&mut self) -> io::Result<()> {
        let filled = std::mem::take(&mut self.len);
        self.out.write_all(&self.bytes[..filled])
    }
}

impl<W: Write> fmt::Write for LineBuffer<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // Bytes, not chars: a piece may end inside a character, the next write completes it.
        let mut s = s.as_bytes();
        while !s.is_empty() {
            if self.len == LINE_BYTES {
                if let Err(e) = self.flush() {
                    self.error = Some(e);
                    return Err(fmt::Error);
                }
            }
            let n = s.len().min(LINE_BYTES - self.len);
            self.bytes[self.len..self.len + n].copy_from_slice(&s[..n]);
            self.len += n;
            s = &s[n..];
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records each `write` call, to see how a line was split.
    #[derive(Default)]
    struct Writes(Vec<Vec<u8>>);

    impl Write for Writes {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_line_is_the_prefix_and_the_message_in_one_write() {
        let mut out = Writes::default();
        write_line(&mut out, "exitless", &format_args!("disk {}: the driver broke a queue", 0)).unwrap();
        assert_eq!(out.0, [b"exitless: disk 0: the driver broke a queue\n".to_vec()]);
    }

    #[test]
    fn a_line_longer_than_the_buffer_is_written_whole_in_pieces() {
        let mut out = Writes::default();
        let long = "é".repeat(LINE_BYTES);
        write_line(&mut out, "exitless vhost-user-blk", &format_args!("{long}")).unwrap();
        assert_eq!(out.0.len(), 3);
        assert!(out.0.iter().all(|piece| piece.len() <= LINE_BYTES));
        assert_eq!(out.0.concat(), format!("exitless vhost-user-blk: {long}\n").into_bytes());
    }
}
