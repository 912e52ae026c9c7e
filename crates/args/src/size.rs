//! Sizes on the command line: `256M`, `1G`, `512MiB`, `4096`.

/// Why a size was refused; each message quotes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// No number where one should be.
    #[error("`{0}` is not a size like 256M or 1G")]
    NotASize(String),
    /// A suffix other than K, M, G or T.
    #[error("`{0}` has an unknown unit; use K, M, G or T")]
    UnknownUnit(String),
    /// More bytes than 64 bits hold.
    #[error("`{0}` is too large")]
    TooLarge(String),
}

/// Parse a byte size with an optional K/M/G/T suffix (binary units; `B`, `iB` accepted).
pub fn parse(text: &str) -> Result<u64, SizeError> {
    let lower = text.trim().to_ascii_lowercase();
    let digits_end = lower.find(|c: char| !c.is_ascii_digit()).unwrap_or(lower.len());
    let (digits, suffix) = lower.split_at(digits_end);
    let number: u64 = digits.parse().map_err(|_| SizeError::NotASize(text.into()))?;
    let shift = match suffix.trim_end_matches("ib").trim_end_matches('b') {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return Err(SizeError::UnknownUnit(text.into())),
    };
    number.checked_mul(1 << shift).ok_or_else(|| SizeError::TooLarge(text.into()))
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn sizes() {
        assert_eq!(parse("4096"), Ok(4096));
        assert_eq!(parse("256M"), Ok(256 << 20));
        assert_eq!(parse("1GiB"), Ok(1 << 30));
        assert_eq!(parse("2g"), Ok(2 << 30));
        assert!(parse("12Q").is_err());
        assert!(parse("M").is_err());
        assert!(parse("99999999999T").is_err());
    }
}
