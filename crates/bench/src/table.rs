//! Tables for reports: aligned plain text for a terminal, or Markdown for BENCHMARKS.md.

pub struct Table {
    pub title: String,
    /// `key: value` lines printed under the title (date, command, machine, ...).
    pub context: Vec<(String, String)>,
    pub header: Vec<&'static str>,
    pub rows: Vec<Vec<String>>,
    /// Lines printed after the table.
    pub notes: Vec<String>,
}

impl Table {
    pub fn render(&self, markdown: bool) -> String {
        let mut out = String::new();
        if markdown {
            out += &format!("### {}\n\n", self.title);
            for (key, value) in &self.context {
                out += &format!("- {key}: {value}\n");
            }
            out += "\n";
            out += &format!("| {} |\n", self.header.join(" | "));
            out += &format!("|{}\n", self.header.iter().map(|_| "---|").collect::<String>());
            for row in &self.rows {
                out += &format!("| {} |\n", row.join(" | "));
            }
            if !self.notes.is_empty() {
                out += "\n";
                for note in &self.notes {
                    out += &format!("- {note}\n");
                }
            }
            out += "\n";
            return out;
        }
        out += &format!("{}\n", self.title);
        for (key, value) in &self.context {
            out += &format!("{key}: {value}\n");
        }
        let widths: Vec<usize> = (0..self.header.len())
            .map(|i| {
                self.rows.iter().filter_map(|r| r.get(i)).map(String::len).chain([self.header[i].len()]).max()
            })
            .map(Option::unwrap_or_default)
            .collect();
        let render = |cells: &mut dyn Iterator<Item = &str>| {
            cells
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_string()
        };
        out += &format!("{}\n", render(&mut self.header.iter().copied()));
        for row in &self.rows {
            out += &format!("{}\n", render(&mut row.iter().map(String::as_str)));
        }
        for note in &self.notes {
            out += &format!("{note}\n");
        }
        out += "\n";
        out
    }
}
