//! What a benchmark ran on, for its report.

use serde::Serialize;

#[derive(Serialize)]
pub struct Machine {
    pub cpu: String,
    pub cpus: usize,
    pub kernel: String,
    /// Which KVM implementation backs /dev/kvm (e.g. `kvm_pvm`, `kvm_intel`).
    pub kvm_backend: String,
}

impl Machine {
    pub fn detect() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, v)| v.trim()))
            .unwrap_or("unknown")
            .to_string();
        let kernel =
            std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
        let kvm_backend = ["kvm_pvm", "kvm_intel", "kvm_amd"]
            .iter()
            .find(|m| std::path::Path::new(&format!("/sys/module/{m}")).exists())
            .unwrap_or(&"unknown")
            .to_string();
        Machine {
            cpu,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel,
            kvm_backend,
        }
    }

    pub fn describe(&self) -> String {
        format!("{} ({} CPUs), Linux {}, KVM backend {}", self.cpu, self.cpus, self.kernel, self.kvm_backend)
    }
}

/// What every report starts with: which benchmark, when, the command, and the machine.
#[derive(Serialize)]
pub struct About {
    pub bench: &'static str,
    pub date: String,
    pub command: String,
    pub machine: Machine,
}

impl About {
    pub fn now(bench: &'static str) -> About {
        About { bench, date: today(), command: super::command_line(), machine: Machine::detect() }
    }

    /// `key: value` lines for a table's heading.
    pub fn context(&self) -> Vec<(String, String)> {
        vec![
            ("date".to_string(), self.date.clone()),
            ("command".to_string(), format!("`{}`", self.command)),
            ("machine".to_string(), self.machine.describe()),
        ]
    }
}

/// Today's date (UTC) as YYYY-MM-DD.
pub fn today() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Days since 1970-01-01 to a proleptic Gregorian date (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    #[test]
    fn civil_dates() {
        assert_eq!(super::civil_from_days(0), (1970, 1, 1));
        assert_eq!(super::civil_from_days(20_779), (2026, 11, 22));
        assert_eq!(super::civil_from_days(11_016), (2000, 2, 29));
    }
}
