//! `resource.Quantity` parsing with upstream's semantics: suffixes, rounding up to the nano
//! unit, capping at the int64 maximum where upstream's arbitrary-precision path does (short
//! decimal values are kept exactly, as by its int64 fast path), canonical formatting, and
//! `Value()`/`MilliValue()` rounding away from zero. Checked against upstream's
//! TestQuantityParse and TestQuantityString tables.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Upstream's three parse errors, with their exact texts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error(
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )]
    FormatWrong,
    #[error("unable to parse numeric part of quantity")]
    Numeric,
    #[error("unable to parse quantity's suffix")]
    Suffix,
}

/// How the quantity was written; upstream keeps it to format the value back the same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    DecimalExponent,
    BinarySI,
    DecimalSI,
}

/// A parsed quantity, held as a whole number of nano-units (upstream's finest scale).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParsedQuantity {
    nanos: i128,
    format: Format,
}

const NANOS_PER_UNIT: i128 = 1_000_000_000;
/// Upstream caps every quantity at the int64 maximum (in units).
const MAX_NANOS: i128 = (i64::MAX as i128) * NANOS_PER_UNIT;

impl ParsedQuantity {
    /// The value in thousandths of a unit, rounded away from zero (upstream `MilliValue()`).
    pub fn milli_value(&self) -> i64 {
        saturate(div_away_from_zero(self.nanos, 1_000_000))
    }

    /// The value in units, rounded away from zero (upstream `Value()`).
    pub fn value(&self) -> i64 {
        saturate(div_away_from_zero(self.nanos, NANOS_PER_UNIT))
    }

    /// The value in nano-units (always exact after parsing, which rounds up to 1n).
    pub fn nano_value(&self) -> i128 {
        self.nanos
    }

    pub fn format(&self) -> Format {
        self.format
    }

    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    pub fn from_nanos(nanos: i128, format: Format) -> ParsedQuantity {
        ParsedQuantity {
            nanos: nanos.clamp(-MAX_NANOS, MAX_NANOS),
            format,
        }
    }

    /// Upstream's canonical string (`CanonicalizeBytes`): the largest suffix of the
    /// quantity's own format that keeps the value whole, e.g. `1536Mi` → `1536Mi`, `1000m` → `1`.
    pub fn canonical(&self) -> String {
        canonical(self.nanos, self.format)
    }
}

impl PartialOrd for ParsedQuantity {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.nanos.cmp(&other.nanos))
    }
}

fn saturate(v: i128) -> i64 {
    v.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

fn div_away_from_zero(v: i128, d: i128) -> i128 {
    let q = v / d;
    if v % d == 0 {
        q
    } else if v > 0 {
        q + 1
    } else {
        q - 1
    }
}

struct Parts<'a> {
    positive: bool,
    num: &'a str,
    denom: &'a str,
    suffix: &'a str,
}

/// Splits a quantity string like upstream's `parseQuantityString`.
fn split(s: &str) -> Result<Parts<'_>, QuantityError> {
    let b = s.as_bytes();
    let end = b.len();
    let mut pos = 0;
    let mut positive = true;
    if let Some(&c) = b.first() {
        if c == b'-' {
            positive = false;
            pos += 1;
        } else if c == b'+' {
            pos += 1;
        }
    }
    while pos < end && b[pos] == b'0' {
        pos += 1;
    }
    if pos >= end {
        return Ok(Parts {
            positive,
            num: "0",
            denom: "",
            suffix: "",
        });
    }
    let num_start = pos;
    while pos < end && b[pos].is_ascii_digit() {
        pos += 1;
    }
    let num = if pos == num_start {
        "0"
    } else {
        &s[num_start..pos]
    };
    let mut denom = "";
    if pos < end && b[pos] == b'.' {
        pos += 1;
        let d_start = pos;
        while pos < end && b[pos].is_ascii_digit() {
            pos += 1;
        }
        denom = &s[d_start..pos];
    }
    let suffix_start = pos;
    while pos < end && b"eEinumkKMGTP".contains(&b[pos]) {
        pos += 1;
    }
    if pos < end && (b[pos] == b'-' || b[pos] == b'+') {
        pos += 1;
    }
    while pos < end && b[pos].is_ascii_digit() {
        pos += 1;
    }
    if pos < end {
        return Err(QuantityError::FormatWrong);
    }
    Ok(Parts {
        positive,
        num,
        denom,
        suffix: &s[suffix_start..],
    })
}

/// (base, exponent, format) of a suffix, as upstream's suffixer interprets it.
fn interpret_suffix(suffix: &str) -> Option<(u32, i32, Format)> {
    let dec = |e| Some((10, e, Format::DecimalSI));
    let bin = |e| Some((2, e, Format::BinarySI));
    match suffix {
        "" => dec(0),
        "n" => dec(-9),
        "u" => dec(-6),
        "m" => dec(-3),
        "k" => dec(3),
        "M" => dec(6),
        "G" => dec(9),
        "T" => dec(12),
        "P" => dec(15),
        "E" => dec(18),
        "Ki" => bin(10),
        "Mi" => bin(20),
        "Gi" => bin(30),
        "Ti" => bin(40),
        "Pi" => bin(50),
        "Ei" => bin(60),
        _ => {
            let rest = suffix.strip_prefix(['e', 'E'])?;
            if rest.is_empty() {
                return None;
            }
            let e: i64 = rest.parse().ok()?;
            // Go truncates to int32; anything this large is capped or rounded anyway.
            let e = e.clamp(-1000, 1000) as i32;
            Some((10, e, Format::DecimalExponent))
        }
    }
}

/// Parses a quantity string exactly as upstream's `resource.ParseQuantity`.
pub fn parse_quantity(s: &str) -> Result<ParsedQuantity, QuantityError> {
    if s.is_empty() {
        return Err(QuantityError::FormatWrong);
    }
    let parts = split(s)?;
    let (base, exponent, format) = interpret_suffix(parts.suffix).ok_or(QuantityError::Suffix)?;
    // Bound the work on absurd inputs (building the number is quadratic in its length):
    // hundreds of integer digits are far above the cap anyway, and fractional digits that
    // far out only decide the rounding, which a sticky flag keeps.
    const MAX_DIGITS: usize = 400;
    let num_digits = if parts.num.len() > MAX_DIGITS {
        &parts.num[..MAX_DIGITS]
    } else {
        parts.num
    };
    let num_dropped = parts.num.len() - num_digits.len();
    let denom = if parts.denom.len() > MAX_DIGITS {
        &parts.denom[..MAX_DIGITS]
    } else {
        parts.denom
    };
    let tail_nonzero = parts.denom[denom.len()..].bytes().any(|b| b != b'0');
    let parts = Parts {
        positive: parts.positive,
        num: num_digits,
        denom,
        suffix: parts.suffix,
    };
    let mut digits = Big::zero();
    for c in parts.num.bytes().chain(parts.denom.bytes()) {
        digits.mul_add(10, u32::from(c - b'0'));
    }
    for _ in 0..num_dropped.min(64) {
        // Dropped integer digits only make the value larger; a few more powers of ten are
        // enough to exceed any cap.
        digits.mul_add(10, 0);
    }
    // value = digits * 10^(dec_exp) * 2^(bin_exp); we want ceil(value * 1e9).
    let mut dec_exp = 9 - parts.denom.len() as i64;
    if base == 10 {
        dec_exp += i64::from(exponent);
    }
    let bin_exp = if base == 2 { exponent as u32 } else { 0 };
    // Upstream keeps short decimal values exactly (its int64 mantissa/scale fast path) and
    // caps everything that takes its arbitrary-precision path at the int64 maximum.
    let digit_count = parts.num.len() + parts.denom.len();
    let fast_path =
        base == 10 && digit_count <= 18 && i64::from(exponent) - parts.denom.len() as i64 >= -9;
    let limit = if fast_path { i128::MAX } else { MAX_NANOS };
    let cap = Big::from_u128(limit as u128);
    // At most 60 doublings: cheap, and capping must wait until the decimal scale is applied.
    for _ in 0..bin_exp {
        digits.mul_add(2, 0);
    }
    let mut inexact = tail_nonzero;
    if dec_exp >= 0 {
        for _ in 0..dec_exp {
            if digits.gt(&cap) {
                break;
            }
            digits.mul_add(10, 0);
        }
    } else {
        for _ in 0..(-dec_exp) {
            if digits.div_small(10) != 0 {
                inexact = true;
            }
            if digits.is_zero() {
                break;
            }
        }
    }
    let mut nanos = if digits.gt(&cap) {
        limit
    } else {
        digits.to_u128() as i128
    };
    if inexact {
        // Upstream rounds any non-zero remainder up to the next nano-unit.
        nanos = (nanos + 1).min(limit);
    }
    // Upstream reports a binary quantity below one unit as decimal ("avoids confusion").
    let format = if format == Format::BinarySI && nanos > 0 && nanos < NANOS_PER_UNIT {
        Format::DecimalSI
    } else {
        format
    };
    if !parts.positive {
        nanos = -nanos;
    }
    Ok(ParsedQuantity { nanos, format })
}

/// Milli-units of a k8s-openapi quantity (e.g. CPU millicores).
pub fn quantity_milli(q: &Quantity) -> Result<i64, QuantityError> {
    Ok(parse_quantity(&q.0)?.milli_value())
}

/// Units of a k8s-openapi quantity (e.g. memory bytes).
pub fn quantity_value(q: &Quantity) -> Result<i64, QuantityError> {
    Ok(parse_quantity(&q.0)?.value())
}

fn canonical(nanos: i128, format: Format) -> String {
    if nanos == 0 {
        return "0".to_string();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let mag = nanos.unsigned_abs();
    if format == Format::BinarySI && mag.is_multiple_of(NANOS_PER_UNIT as u128) {
        let units = mag / NANOS_PER_UNIT as u128;
        // Upstream only uses binary suffixes when the value is at least 1Ki... and exact.
        if units >= 1024 {
            let suffixes = ["Ei", "Pi", "Ti", "Gi", "Mi", "Ki"];
            for (i, suf) in suffixes.iter().enumerate() {
                let shift = 10 * (6 - i) as u32;
                if units.is_multiple_of(1u128 << shift) {
                    return format!("{sign}{}{suf}", units >> shift);
                }
            }
        }
    }
    // Decimal: pick the largest power-of-1000 scale dividing the value.
    let scales: [(u32, &str, &str); 10] = [
        (27, "E", "e18"),
        (24, "P", "e15"),
        (21, "T", "e12"),
        (18, "G", "e9"),
        (15, "M", "e6"),
        (12, "k", "e3"),
        (9, "", ""),
        (6, "m", "e-3"),
        (3, "u", "e-6"),
        (0, "n", "e-9"),
    ];
    for (pow, si, exp) in scales {
        let unit = 10u128.pow(pow);
        if mag.is_multiple_of(unit) {
            let suf = if format == Format::DecimalExponent {
                exp
            } else {
                si
            };
            return format!("{sign}{}{suf}", mag / unit);
        }
    }
    format!("{sign}{mag}n")
}

/// Just enough arbitrary-precision arithmetic to parse long digit strings exactly.
struct Big(Vec<u32>);

impl Big {
    fn zero() -> Big {
        Big(Vec::new())
    }

    fn from_u128(mut v: u128) -> Big {
        let mut limbs = Vec::new();
        while v > 0 {
            limbs.push(v as u32);
            v >>= 32;
        }
        Big(limbs)
    }

    fn is_zero(&self) -> bool {
        self.0.iter().all(|&l| l == 0)
    }

    fn mul_add(&mut self, m: u32, a: u32) {
        let mut carry = u64::from(a);
        for limb in &mut self.0 {
            let v = u64::from(*limb) * u64::from(m) + carry;
            *limb = v as u32;
            carry = v >> 32;
        }
        if carry > 0 {
            self.0.push(carry as u32);
        }
    }

    /// Divides in place and returns the remainder.
    fn div_small(&mut self, d: u32) -> u32 {
        let mut rem = 0u64;
        for limb in self.0.iter_mut().rev() {
            let v = (rem << 32) | u64::from(*limb);
            *limb = (v / u64::from(d)) as u32;
            rem = v % u64::from(d);
        }
        self.trim();
        rem as u32
    }

    fn trim(&mut self) {
        while self.0.last() == Some(&0) {
            self.0.pop();
        }
    }

    fn gt(&self, other: &Big) -> bool {
        let a = self.0.iter().rposition(|&l| l != 0).map_or(0, |i| i + 1);
        let b = other.0.iter().rposition(|&l| l != 0).map_or(0, |i| i + 1);
        if a != b {
            return a > b;
        }
        for i in (0..a).rev() {
            if self.0[i] != other.0[i] {
                return self.0[i] > other.0[i];
            }
        }
        false
    }

    fn to_u128(&self) -> u128 {
        self.0
            .iter()
            .rev()
            .fold(0u128, |acc, &l| (acc << 32) | u128::from(l))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> ParsedQuantity {
        match parse_quantity(s) {
            Ok(q) => q,
            Err(e) => panic!("{s}: {e}"),
        }
    }

    #[test]
    fn values_and_millis_like_upstream() {
        assert_eq!(q("100m").milli_value(), 100);
        assert_eq!(q("100m").value(), 1);
        assert_eq!(q("1").milli_value(), 1000);
        assert_eq!(q("0.5").milli_value(), 500);
        assert_eq!(q("1.5Gi").value(), 1_610_612_736);
        assert_eq!(q("1Ki").value(), 1024);
        assert_eq!(q("128Mi").value(), 134_217_728);
        assert_eq!(q("1k").value(), 1000);
        assert_eq!(q("1M").value(), 1_000_000);
        assert_eq!(q("1e3").value(), 1000);
        assert_eq!(q("1E3").value(), 1000);
        assert_eq!(q("1e-3").milli_value(), 1);
        assert_eq!(q("-1").value(), -1);
        assert_eq!(q("+2").value(), 2);
        assert_eq!(q("-100m").value(), -1);
        assert_eq!(q(".5").milli_value(), 500);
        assert_eq!(q("5.").value(), 5);
        assert_eq!(q("0").value(), 0);
        assert_eq!(q("00100m").milli_value(), 100);
        // Rounded up to the nano-unit at parse time, then to the milli-unit when read.
        assert_eq!(q("1n").milli_value(), 1);
        assert_eq!(q("0.1n").nano_value(), 1);
        assert_eq!(q("1.0001m").milli_value(), 2);
        assert_eq!(q("250u").milli_value(), 1);
        // Capped at the int64 maximum like upstream.
        assert_eq!(q("100000000000000000000E").value(), i64::MAX);
        assert_eq!(q("1Ei").value(), 1_152_921_504_606_846_976);
        assert_eq!(q("1234567890123456789.5m").value(), 1_234_567_890_123_457);
    }

    /// `decQuantity(v, scale, format)` of upstream's TestQuantityParse, as nano-units.
    fn dec(v: i128, scale: i32) -> i128 {
        let e = scale + 9;
        if e >= 0 {
            v * 10i128.pow(e as u32)
        } else {
            v / 10i128.pow((-e) as u32)
        }
    }

    #[test]
    fn upstream_parse_table() {
        use Format::*;
        let max = MAX_NANOS;
        let table: Vec<(&str, i128, Format)> = vec![
            ("0", 0, DecimalSI),
            ("0n", 0, DecimalSI),
            ("0u", 0, DecimalSI),
            ("0m", 0, DecimalSI),
            ("0Ki", 0, BinarySI),
            ("0k", 0, DecimalSI),
            ("0Mi", 0, BinarySI),
            ("0M", 0, DecimalSI),
            ("0Gi", 0, BinarySI),
            ("0G", 0, DecimalSI),
            ("0Ti", 0, BinarySI),
            ("0T", 0, DecimalSI),
            ("1", dec(1, 0), DecimalSI),
            ("1Ki", dec(1024, 0), BinarySI),
            ("8Ki", dec(8 * 1024, 0), BinarySI),
            ("7Mi", dec(7 << 20, 0), BinarySI),
            ("6Gi", dec(6 << 30, 0), BinarySI),
            ("5Ti", dec(5 << 40, 0), BinarySI),
            ("4Pi", dec(4 << 50, 0), BinarySI),
            ("3Ei", dec(3 << 60, 0), BinarySI),
            ("10Ti", dec(10 << 40, 0), BinarySI),
            ("100Ti", dec(100 << 40, 0), BinarySI),
            ("5n", dec(5, -9), DecimalSI),
            ("4u", dec(4, -6), DecimalSI),
            ("3m", dec(3, -3), DecimalSI),
            ("9", dec(9, 0), DecimalSI),
            ("8k", dec(8, 3), DecimalSI),
            ("50k", dec(5, 4), DecimalSI),
            ("7M", dec(7, 6), DecimalSI),
            ("6G", dec(6, 9), DecimalSI),
            ("5T", dec(5, 12), DecimalSI),
            ("40T", dec(4, 13), DecimalSI),
            ("300T", dec(3, 14), DecimalSI),
            ("2P", dec(2, 15), DecimalSI),
            ("1E", dec(1, 18), DecimalSI),
            ("1E-3", dec(1, -3), DecimalExponent),
            ("1e3", dec(1, 3), DecimalExponent),
            ("1E6", dec(1, 6), DecimalExponent),
            ("1e9", dec(1, 9), DecimalExponent),
            ("1E12", dec(1, 12), DecimalExponent),
            ("1e15", dec(1, 15), DecimalExponent),
            ("1E18", dec(1, 18), DecimalExponent),
            ("1e14", dec(1, 14), DecimalExponent),
            ("100.035k", dec(100035, 0), DecimalSI),
            ("0.001", dec(1, -3), DecimalSI),
            ("0.0005k", dec(5, -1), DecimalSI),
            ("0.005", dec(5, -3), DecimalSI),
            ("0.05", dec(5, -2), DecimalSI),
            ("0.5", dec(5, -1), DecimalSI),
            ("0.00050k", dec(5, -1), DecimalSI),
            ("0.00500", dec(5, -3), DecimalSI),
            ("0.50000", dec(5, -1), DecimalSI),
            ("0.5e0", dec(5, -1), DecimalExponent),
            ("0.5e-1", dec(5, -2), DecimalExponent),
            ("0.5e-2", dec(5, -3), DecimalExponent),
            ("10.035M", dec(10035, 3), DecimalSI),
            ("1.2e3", dec(12, 2), DecimalExponent),
            ("1.3E+6", dec(13, 5), DecimalExponent),
            ("1.40e9", dec(14, 8), DecimalExponent),
            ("1.53E12", dec(153, 10), DecimalExponent),
            ("1.6e15", dec(16, 14), DecimalExponent),
            ("1.7E18", dec(17, 17), DecimalExponent),
            ("9.01", dec(901, -2), DecimalSI),
            ("8.1k", dec(81, 2), DecimalSI),
            ("7.123456M", dec(7123456, 0), DecimalSI),
            ("6.987654321G", dec(6987654321, 0), DecimalSI),
            ("5.444T", dec(5444, 9), DecimalSI),
            ("40.1T", dec(401, 11), DecimalSI),
            ("300.2T", dec(3002, 11), DecimalSI),
            ("2.5P", dec(25, 14), DecimalSI),
            ("1.01E", dec(101, 16), DecimalSI),
            ("3.001n", dec(4, -9), DecimalSI),
            ("1.1E-9", dec(2, -9), DecimalExponent),
            ("0.0000000001", dec(1, -9), DecimalSI),
            ("0.0000000005", dec(1, -9), DecimalSI),
            ("0.00000000050", dec(1, -9), DecimalSI),
            ("0.5e-9", dec(1, -9), DecimalExponent),
            ("0.9n", dec(1, -9), DecimalSI),
            ("0.00000012345", dec(124, -9), DecimalSI),
            ("0.00000012354", dec(124, -9), DecimalSI),
            ("9Ei", max, BinarySI),
            ("9223372036854775807Ki", max, BinarySI),
            ("12E", dec(12, 18), DecimalSI),
            ("100.035Ki", dec(10243584, -2), BinarySI),
            ("0.5Mi", dec(512 * 1024, 0), BinarySI),
            ("0.05Gi", dec(536870912, -1), BinarySI),
            ("0.025Ti", dec(274877906944, -1), BinarySI),
            ("0.000000000001Ki", dec(2, -9), DecimalSI),
            (".001", dec(1, -3), DecimalSI),
            (".0001k", dec(100, -3), DecimalSI),
            ("1.", dec(1, 0), DecimalSI),
            ("1.G", dec(1, 9), DecimalSI),
        ];
        for (input, nanos, format) in table {
            for (prefix, sign) in [("", 1), ("+", 1), ("-", -1)] {
                let s = format!("{prefix}{input}");
                let got = parse_quantity(&s).map(|q| (q.nano_value(), q.format()));
                assert_eq!(got, Ok((sign * nanos, format)), "{s}");
            }
        }
        for bad in [
            "1.1.M", "1+1.0M", "0.1mi", "0.1am", "aoeu", ".5i", "1i", "-3.01i", "-3.01e-", " 1",
            "1 ",
        ] {
            assert!(parse_quantity(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn upstream_string_table() {
        let cases = [
            ("1Gi", "1Gi"),
            ("300Mi", "300Mi"),
            ("6Ki", "6Ki"),
            ("1001Gi", "1001Gi"),
            ("1024Gi", "1Ti"),
            ("5", "5"),
            ("1G", "1G"),
            ("1000M", "1G"),
            ("1000000k", "1G"),
            ("1000000000", "1G"),
            ("1m", "1m"),
            ("80m", "80m"),
            ("1080m", "1080m"),
            ("1.08", "1080m"),
            ("300M", "300M"),
            ("1T", "1T"),
            ("1234567M", "1234567M"),
            ("3k", "3k"),
            ("1025", "1025"),
            ("0", "0"),
            ("1e9", "1e9"),
            ("1e-3", "1e-3"),
            ("1e-9", "1e-9"),
            ("80e-3", "80e-3"),
            ("300e6", "300e6"),
            ("1e12", "1e12"),
            ("3e3", "3e3"),
            ("-9010m", "-9010m"),
            ("0.5Ki", "512"),
        ];
        for (input, want) in cases {
            assert_eq!(
                parse_quantity(input).map(|q| q.canonical()),
                Ok(want.to_string()),
                "{input}"
            );
        }
    }

    #[test]
    fn formats() {
        assert_eq!(q("1Gi").format(), Format::BinarySI);
        assert_eq!(q("1G").format(), Format::DecimalSI);
        assert_eq!(q("1e9").format(), Format::DecimalExponent);
        assert_eq!(q("1536Mi").canonical(), "1536Mi");
        assert_eq!(q("1024Mi").canonical(), "1Gi");
        assert_eq!(q("1000m").canonical(), "1");
        assert_eq!(q("1500m").canonical(), "1500m");
        assert_eq!(q("2000").canonical(), "2k");
        assert_eq!(q("0").canonical(), "0");
    }

    #[test]
    fn rejects_like_upstream() {
        let re = QuantityError::FormatWrong.to_string();
        assert_eq!(
            re,
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        );
        for bad in [
            "", "1.5x", "abc", "1 Gi", "1Gi ", "--1", "1e1.0", "1ee", "1e3e",
        ] {
            assert!(parse_quantity(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_quantity("1.5x"), Err(QuantityError::FormatWrong));
        assert_eq!(parse_quantity("1K"), Err(QuantityError::Suffix));
        assert_eq!(parse_quantity("1Gb"), Err(QuantityError::FormatWrong));
        assert_eq!(parse_quantity("1iK"), Err(QuantityError::Suffix));
        assert_eq!(parse_quantity("1e"), Err(QuantityError::Suffix));
        assert_eq!(
            QuantityError::Suffix.to_string(),
            "unable to parse quantity's suffix"
        );
    }

    #[test]
    fn absurdly_long_inputs_stay_cheap_and_capped() {
        let huge = format!("{}Ki", "9".repeat(200_000));
        assert_eq!(parse_quantity(&huge).map(|q| q.value()), Ok(i64::MAX));
        let tiny = format!("0.{}1", "0".repeat(200_000));
        assert_eq!(parse_quantity(&tiny).map(|q| q.nano_value()), Ok(1));
        let exact = format!("1.{}", "0".repeat(200_000));
        assert_eq!(parse_quantity(&exact).map(|q| q.value()), Ok(1));
    }

    #[test]
    fn helpers_on_openapi_quantities() {
        assert_eq!(quantity_milli(&Quantity("250m".into())), Ok(250));
        assert_eq!(quantity_value(&Quantity("64Mi".into())), Ok(67_108_864));
        assert!(quantity_value(&Quantity("lots".into())).is_err());
    }
}
