//! Writing the Prometheus text exposition format (version 0.0.4), as the daemons' `GET /metrics`
//! answers: a family's `# HELP` and `# TYPE` lines, then its samples.

use std::fmt::Write;
use std::time::Duration;

/// The exposition's content type.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// A family's header: its name, kind (`counter`, `gauge`, `histogram`) and help text.
pub fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// One sample of family `name` with `labels`.
pub fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: u64) {
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
    let _ = writeln!(out, "{name}{{{}}} {value}", labels.join(","));
}

/// A counter family of seconds with one sample per IOCore, labelled by its index (`iocore`).
pub fn per_iocore_seconds(
    out: &mut String,
    name: &str,
    help: &str,
    seconds: impl IntoIterator<Item = Duration>,
) {
    family(out, name, "counter", help);
    for (k, time) in seconds.into_iter().enumerate() {
        let _ = writeln!(out, "{name}{{iocore=\"{k}\"}} {}", time.as_secs_f64());
    }
}

/// A label value's escapes (resource names cannot hold these; the format still asks).
pub fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_and_its_samples_read_as_the_format_says() {
        let mut out = String::new();
        family(&mut out, "x_total", "counter", "Things.");
        sample(&mut out, "x_total", &[("nic", "a\"b")], 3);
        assert_eq!(out, "# HELP x_total Things.\n# TYPE x_total counter\nx_total{nic=\"a\\\"b\"} 3\n");
    }

    #[test]
    fn per_iocore_seconds_are_a_sample_per_iocore() {
        let mut out = String::new();
        per_iocore_seconds(
            &mut out,
            "t_seconds_total",
            "Time.",
            [Duration::from_millis(1500), Duration::ZERO],
        );
        let samples = "t_seconds_total{iocore=\"0\"} 1.5\nt_seconds_total{iocore=\"1\"} 0\n";
        assert_eq!(out, format!("# HELP t_seconds_total Time.\n# TYPE t_seconds_total counter\n{samples}"));
    }
}
