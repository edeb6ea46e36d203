//! Shared pieces of nodus's benchmarks: writing a result section into docs/PERFORMANCE.md.

pub mod cluster;
pub mod controlplane;
pub mod floor;
pub mod targets;
pub mod treecpu;

use std::path::{Path, PathBuf};

/// The command line every benchmark takes: `[--write FILE]`, where FILE (usually
/// docs/PERFORMANCE.md) gets the result section.
pub fn write_arg() -> Result<Option<PathBuf>, String> {
    let mut write = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--write" => write = Some(args.next().ok_or("--write needs a FILE")?.into()),
            other => return Err(format!("unknown argument {other:?}; usage: [--write FILE]")),
        }
    }
    Ok(write)
}

/// The nodus binary under test: `$NODUS_BIN`, else the workspace's release build.
pub fn nodus_bin() -> PathBuf {
    std::env::var_os("NODUS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| "target/release/nodus".into())
}

/// The first line of `<program> --version`, without `prefix` when it starts so (`"runc
/// version "`); empty when the program cannot be run.
pub fn tool_version(program: impl AsRef<std::ffi::OsStr>, prefix: &str) -> String {
    std::process::Command::new(program)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            let out = String::from_utf8_lossy(&o.stdout);
            let line = out.lines().next()?;
            Some(line.strip_prefix(prefix).unwrap_or(line).to_string())
        })
        .unwrap_or_default()
}

/// Which profile built `bin`, for a section's "Measured …" line.
pub fn build_profile(bin: &Path) -> &'static str {
    if bin.to_string_lossy().contains("/debug/") {
        "debug"
    } else {
        "release"
    }
}

/// Today's UTC date, `YYYY-MM-DD`, for a section's "Measured …" line.
pub fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|t| t.strftime("%Y-%m-%d").to_string())
        .unwrap_or_default()
}

/// Replaces the section between `<!-- bench:NAME:start -->` and `<!-- bench:NAME:end -->`
/// in `path` with `body`, or appends it under `heading` when the markers are absent.
pub fn write_section(path: &Path, name: &str, heading: &str, body: &str) -> std::io::Result<()> {
    let start = format!("<!-- bench:{name}:start -->");
    let end = format!("<!-- bench:{name}:end -->");
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let section = format!("{start}\n{body}{end}");
    let new = match (old.find(&start), old.find(&end)) {
        (Some(a), Some(b)) if b > a => {
            format!("{}{section}{}", &old[..a], &old[b + end.len()..])
        }
        _ => format!("{old}\n{heading}\n\n{section}\n"),
    };
    std::fs::write(path, new)
}

#[cfg(test)]
mod tests {
    #[test]
    fn sections_are_replaced_in_place() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("PERF.md");
        std::fs::write(&p, "# Perf\n").unwrap();
        super::write_section(&p, "x", "## X", "one\n").unwrap();
        super::write_section(&p, "x", "## X", "two\n").unwrap();
        let s = std::fs::read_to_string(&p).unwrap();
        assert!(s.contains("two") && !s.contains("one"), "{s}");
        assert_eq!(s.matches("## X").count(), 1);
    }
}
