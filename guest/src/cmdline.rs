//! `key=value` parameters from the kernel command line.

/// The value of the last `key=value` on the command line.
pub fn get<'a>(cmdline: &'a str, key: &str) -> Option<&'a str> {
    cmdline
        .split_ascii_whitespace()
        .rev()
        .filter_map(|word| word.split_once('='))
        .filter(|(k, _)| *k == key)
        .map(|(_, v)| v)
        .next()
}

/// A number in decimal or `0x` hex, with an optional K/M/G (binary) suffix.
pub fn parse_u64(text: &str) -> Option<u64> {
    let (digits, scale) = match text.as_bytes().last()? {
        b'K' | b'k' => (&text[..text.len() - 1], 1 << 10),
        b'M' | b'm' => (&text[..text.len() - 1], 1 << 20),
        b'G' | b'g' => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1),
    };
    let value = match digits.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok()?,
        None => digits.parse().ok()?,
    };
    value.checked_mul(scale)
}

/// A numeric parameter, `default` when absent; `Err(key)` when present but not a number.
pub fn get_u64<'k>(cmdline: &str, key: &'k str, default: u64) -> Result<u64, &'k str> {
    match get(cmdline, key) {
        None => Ok(default),
        Some(v) => parse_u64(v).ok_or(key),
    }
}
