//! QMP, QEMU's machine protocol, as tests drive it: connect, run commands, migrate, quit.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Just enough of QMP: commands in, their `return` values out, events kept as they came.
pub struct Qmp {
    lines: BufReader<UnixStream>,
    stream: UnixStream,
    events: String,
}

impl Qmp {
    /// Connect to `-qmp unix:PATH,server=on,wait=off`, retrying while QEMU starts.
    pub fn connect(path: &Path) -> Qmp {
        let started = Instant::now();
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(stream) => break stream,
                Err(e) if started.elapsed() > Duration::from_secs(30) => {
                    panic!("QMP {}: {e}", path.display())
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut qmp =
            Qmp { lines: BufReader::new(stream.try_clone().unwrap()), stream, events: String::new() };
        let mut greeting = String::new();
        qmp.lines.read_line(&mut greeting).unwrap();
        qmp.run(json!({ "execute": "qmp_capabilities" }));
        qmp
    }

    /// `migrate` to `uri`, then `query-migrate` until it completed: its answer. Fails the test
    /// if it failed or did not complete by `deadline`, with what `context` says (and checks).
    pub fn migrate(&mut self, uri: &str, deadline: Instant, context: &mut dyn FnMut() -> String) -> Value {
        self.run(json!({ "execute": "migrate", "arguments": { "uri": uri } }));
        loop {
            let info = self.run(json!({ "execute": "query-migrate" }));
            match info["status"].as_str() {
                Some("completed") => return info,
                Some("failed") | Some("cancelled") => panic!("the migration failed: {info}\n{}", context()),
                _ => {}
            }
            assert!(
                Instant::now() < deadline,
                "the migration did not complete in time: {info}\n{}",
                context()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `quit`; if QEMU had already closed QMP (it ended by itself), the events it sent last.
    pub fn quit(&mut self) -> Result<(), String> {
        let sent = writeln!(self.stream, "{}", json!({ "execute": "quit" }));
        let mut line = String::new();
        while self.lines.read_line(&mut line).unwrap_or(0) > 0 {
            if line.contains("\"return\"") && sent.is_ok() {
                return Ok(());
            }
            self.events.push_str(&line);
            line.clear();
        }
        Err(format!("QEMU closed QMP before it answered quit ({sent:?}); its events: {}", self.events))
    }

    /// Send `command`; its `return` value (the test fails on an error).
    pub fn run(&mut self, command: Value) -> Value {
        writeln!(self.stream, "{command}").unwrap();
        loop {
            let mut line = String::new();
            assert_ne!(self.lines.read_line(&mut line).unwrap(), 0, "QEMU closed QMP");
            let mut answer: Value = serde_json::from_str(&line).unwrap();
            assert!(answer.get("error").is_none(), "{command}: {answer}");
            if let Some(value) = answer.get_mut("return") {
                return value.take();
            }
            self.events.push_str(&line);
        }
    }
}
