//! Sizes with a unit, as an operator writes them: the one reading of `4 GB` for the statements'
//! `SIZE =`, the `bpe_extension` PRAGMA and the `BPE_EXTENSION_SIZE` variable.
//!
//! A size is a whole number above 0, then a unit (KB, MB, GB or TB, any case, binary: 1 KB =
//! 1024 bytes), with or without blanks between them, and no sign: `4 GB`, `4GB`, `512 mb`. The
//! product must fit in 64 bits.

use std::fmt;

pub const KB: u64 = 1 << 10;
pub const MB: u64 = 1 << 20;
pub const GB: u64 = 1 << 30;
pub const TB: u64 = 1 << 40;

/// The units, largest first.
const UNITS: [(u64, &str); 4] = [(TB, "TB"), (GB, "GB"), (MB, "MB"), (KB, "KB")];

/// `bytes` in the largest unit that divides it: (4, "GB"); (12345, "bytes") when none does.
pub fn in_largest_unit(bytes: u64) -> (u64, &'static str) {
    UNITS
        .into_iter()
        .find(|&(unit, _)| bytes >= unit && bytes.is_multiple_of(unit))
        .map_or((bytes, "bytes"), |(unit, name)| (bytes / unit, name))
}

/// Why a size was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeError {
    /// No number where the size starts.
    NotASize,
    Negative,
    /// A `+` before the number.
    Signed,
    Fraction,
    NoUnit,
    UnknownUnit,
    Zero,
    TooLarge,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SizeError::NotASize => "expected a whole number followed by KB, MB, GB or TB",
            SizeError::Negative => "the size must be positive",
            SizeError::Signed => "the size takes no sign",
            SizeError::Fraction => "the size must be a whole number (use a smaller unit)",
            SizeError::NoUnit => "a unit is required: KB, MB, GB or TB (as in SIZE = 4 GB)",
            SizeError::UnknownUnit => "unknown unit: use KB, MB, GB or TB",
            SizeError::Zero => "the size must be greater than 0",
            SizeError::TooLarge => "the size is too large",
        })
    }
}

impl std::error::Error for SizeError {}

/// Reads a size such as `4 GB` (see the module comment); surrounding blanks are ignored.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let text = text.trim();
    let (sign, rest) = match text.strip_prefix(['-', '+']) {
        Some(rest) => (text.chars().next(), rest),
        None => (None, text),
    };
    let whole_end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    if whole_end == 0 {
        return Err(SizeError::NotASize);
    }
    let (whole, after) = rest.split_at(whole_end);
    let (fraction, unit) = match after.strip_prefix('.') {
        Some(f) => {
            let end = f.find(|c: char| !c.is_ascii_digit()).unwrap_or(f.len());
            (true, &f[end..])
        }
        None => (false, after),
    };
    match sign {
        Some('-') => return Err(SizeError::Negative),
        Some(_) => return Err(SizeError::Signed),
        None => {}
    }
    if fraction {
        return Err(SizeError::Fraction);
    }
    let unit = unit.trim_start();
    if unit.is_empty() {
        return Err(SizeError::NoUnit);
    }
    let (multiplier, _) = UNITS
        .into_iter()
        .find(|(_, name)| unit.eq_ignore_ascii_case(name))
        .ok_or(SizeError::UnknownUnit)?;
    let n: u64 = whole.parse().map_err(|_| SizeError::TooLarge)?;
    if n == 0 {
        return Err(SizeError::Zero);
    }
    n.checked_mul(multiplier).ok_or(SizeError::TooLarge)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_every_unit_and_spacing() {
        assert_eq!(parse_size("4 GB"), Ok(4 * GB));
        assert_eq!(parse_size("4GB"), Ok(4 * GB));
        assert_eq!(parse_size(" 512 mb "), Ok(512 * MB));
        assert_eq!(parse_size("2048\tKb"), Ok(2 * MB));
        assert_eq!(parse_size("1 TB"), Ok(TB));
        assert_eq!(parse_size("007 MB"), Ok(7 * MB));
    }

    #[test]
    fn largest_units() {
        assert_eq!(in_largest_unit(4 * GB), (4, "GB"));
        assert_eq!(in_largest_unit(1536 * KB), (1536, "KB"));
        assert_eq!(in_largest_unit(TB << 20), (1 << 20, "TB"));
        assert_eq!(in_largest_unit(12345), (12345, "bytes"));
        assert_eq!(in_largest_unit(0), (0, "bytes"));
    }

    #[test]
    fn bad_sizes_name_the_problem() {
        for (text, error) in [
            ("", SizeError::NotASize),
            ("GB", SizeError::NotASize),
            ("-", SizeError::NotASize),
            ("-1 GB", SizeError::Negative),
            ("+1 GB", SizeError::Signed),
            ("1.5 GB", SizeError::Fraction),
            ("4.", SizeError::Fraction),
            ("4", SizeError::NoUnit),
            ("4 PB", SizeError::UnknownUnit),
            ("12 parsecs", SizeError::UnknownUnit),
            ("4 GB x", SizeError::UnknownUnit),
            ("0 GB", SizeError::Zero),
            ("16777216 TB", SizeError::TooLarge),
            ("99999999999999999999 GB", SizeError::TooLarge),
        ] {
            assert_eq!(parse_size(text), Err(error), "{text:?}");
        }
    }
}
