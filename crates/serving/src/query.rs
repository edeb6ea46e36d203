//! URL query strings as upstream's servers read them: percent-decoding (with `+` as a
//! space, as Go's `url.ParseQuery` does), every value of a repeated key, and booleans as
//! apimachinery converts them.

use std::collections::HashMap;

/// Escapes every byte but the unreserved ones (`A-Z a-z 0-9 - . _ ~`) as `%XX`, as Go's
/// `url.PathEscape` does for a header or path segment.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Decodes `%XX` escapes and `+`; a malformed escape is kept as written.
pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(c) => {
                        out.push(c);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn pairs(raw: Option<&str>) -> impl Iterator<Item = (String, String)> + '_ {
    raw.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
}

/// Every value of `key`, decoded, in order (exec's repeated `command`).
pub fn query_all(raw: Option<&str>, key: &str) -> Vec<String> {
    pairs(raw)
        .filter_map(|(k, v)| (k == key).then_some(v))
        .collect()
}

/// The query as a map; a repeated key keeps its first value, as Go's `url.Values.Get`
/// and apimachinery's parameter decoding do.
pub fn parse_query(raw: Option<&str>) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for (k, v) in pairs(raw) {
        out.entry(k).or_insert(v);
    }
    out
}

/// A boolean query parameter as apimachinery's `Convert_Slice_string_To_bool` reads it:
/// absent is false; `0` and `false` in any case are false; anything else — `True`, `yes`,
/// an empty value — is true. Clients rely on it: Python's client sends `watch=True`.
pub fn bool_value(v: Option<&str>) -> bool {
    match v {
        None => false,
        Some(v) => !(v == "0" || v.eq_ignore_ascii_case("false")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn percent_encode_keeps_only_unreserved_bytes() {
        assert_eq!(
            super::percent_encode("authentication.kubernetes.io/pod-name"),
            "authentication.kubernetes.io%2Fpod-name"
        );
        assert_eq!(super::percent_encode("a b~_-"), "a%20b~_-");
        assert_eq!(
            super::percent_decode(&super::percent_encode("x/y z")),
            "x/y z"
        );
    }

    use super::*;

    #[test]
    fn booleans_read_as_apimachinery_does() {
        for (v, want) in [
            (None, false),
            (Some("0"), false),
            (Some("false"), false),
            (Some("FALSE"), false),
            (Some("False"), false),
            (Some("1"), true),
            (Some("true"), true),
            (Some("True"), true),
            (Some("TRUE"), true),
            (Some("yes"), true),
            (Some(""), true),
        ] {
            assert_eq!(bool_value(v), want, "{v:?}");
        }
    }

    #[test]
    fn decoding_and_repeated_keys() {
        assert_eq!(percent_decode("a%20b+c%2Fd%zz%4"), "a b c/d%zz%4");
        let raw = Some("command=sh&command=-c&command=echo+%24HOME&tty=1&&x");
        assert_eq!(query_all(raw, "command"), ["sh", "-c", "echo $HOME"]);
        let q = parse_query(raw);
        assert_eq!(q["command"], "sh");
        assert_eq!(q["x"], "");
        assert_eq!(q["tty"], "1");
    }
}
