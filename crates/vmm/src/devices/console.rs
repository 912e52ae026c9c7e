//! Where the guest's serial output goes: standard output, a capture buffer, or both.

use std::io::{self, Write};
use std::sync::{Arc, Mutex};

/// The most console output kept in memory; a guest that prints more loses the excess, not the
/// host its memory.
pub const CAPTURE_LIMIT: usize = 16 << 20;

/// Where the guest's serial console output goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConsoleMode {
    /// Print to the VMM's standard output.
    #[default]
    Stdout,
    /// Keep the output for the caller (benchmarks, tests).
    Capture,
    /// Both.
    Tee,
}

/// The writer the UART sends bytes to.
#[derive(Clone)]
pub struct ConsoleWriter {
    to_stdout: bool,
    capture: Option<Arc<Mutex<Vec<u8>>>>,
}

impl ConsoleWriter {
    pub fn new(mode: ConsoleMode) -> Self {
        let capture =
            matches!(mode, ConsoleMode::Capture | ConsoleMode::Tee).then(|| Arc::new(Mutex::new(Vec::new())));
        ConsoleWriter { to_stdout: mode != ConsoleMode::Capture, capture }
    }

    /// Everything captured so far.
    pub fn captured(&self) -> Vec<u8> {
        self.capture.as_ref().map(|c| super::lock(c).clone()).unwrap_or_default()
    }
}

impl Write for ConsoleWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(capture) = &self.capture {
            let mut capture = super::lock(capture);
            let room = CAPTURE_LIMIT.saturating_sub(capture.len());
            capture.extend_from_slice(&buf[..buf.len().min(room)]);
        }
        if self.to_stdout {
            // A closed stdout must not stop the VM: the output is lost, the guest runs on.
            let _ = io::stdout().write_all(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.to_stdout {
            let _ = io::stdout().flush();
        }
        Ok(())
    }
}
