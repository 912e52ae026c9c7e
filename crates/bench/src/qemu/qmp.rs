//! Just enough of QMP, QEMU's JSON control protocol, to read KVM's vCPU statistics
//! (`query-stats`, QEMU 7.1 and later).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use super::QemuError;

/// The counters asked for: the same causes exitless reports.
pub const STATS: [&str; 7] =
    ["exits", "mmio_exits", "io_exits", "halt_exits", "irq_exits", "insn_emulation", "irq_injections"];

pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    /// Connect to QEMU's `-qmp unix:PATH,server=on` and leave capabilities negotiation.
    pub fn connect(path: &Path) -> Result<Qmp, QemuError> {
        let error = |e: std::io::Error| QemuError::Qmp(format!("{}: {e}", path.display()));
        let stream = UnixStream::connect(path).map_err(error)?;
        stream.set_read_timeout(Some(Duration::from_secs(10))).map_err(error)?;
        let writer = stream.try_clone().map_err(error)?;
        let mut qmp = Qmp { reader: BufReader::new(stream), writer };
        qmp.read_message()?; // the greeting
        qmp.execute(json!({ "execute": "qmp_capabilities" }))?;
        Ok(qmp)
    }

    fn read_message(&mut self) -> Result<Value, QemuError> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err(QemuError::Qmp("QEMU closed the QMP socket".into())),
            Ok(_) => serde_json::from_str(&line).map_err(|e| QemuError::Qmp(format!("bad QMP message: {e}"))),
            Err(e) => Err(QemuError::Qmp(e.to_string())),
        }
    }

    /// Send a command and return its `return` value (events in between are skipped).
    fn execute(&mut self, command: Value) -> Result<Value, QemuError> {
        writeln!(self.writer, "{command}").map_err(|e| QemuError::Qmp(e.to_string()))?;
        loop {
            let mut message = self.read_message()?;
            if let Some(error) = message.get("error") {
                return Err(QemuError::Qmp(format!("{command}: {error}")));
            }
            if let Some(value) = message.get_mut("return") {
                return Ok(value.take());
            }
        }
    }

    /// KVM's statistics of vCPU 0: (name, value) for each of [`STATS`] QEMU reports.
    pub fn vcpu_stats(&mut self) -> Result<Vec<(String, u64)>, QemuError> {
        let answer = self.execute(json!({
            "execute": "query-stats",
            "arguments": { "target": "vcpu", "providers": [{ "provider": "kvm", "names": STATS }] }
        }))?;
        let stats = answer
            .get(0)
            .and_then(|vcpu| vcpu["stats"].as_array())
            .ok_or_else(|| QemuError::Qmp(format!("query-stats answered {answer}")))?;
        Ok(stats
            .iter()
            .filter_map(|s| Some((s["name"].as_str()?.to_string(), s["value"].as_u64()?)))
            .collect())
    }
}
