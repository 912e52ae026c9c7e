//! Writing the Prometheus text exposition format (version 0.0.4), as the daemons' `GET /metrics`
//! answers: a family's `# HELP` and `# TYPE` lines, then its samples.

use std::fmt::Write;

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
}
