//! Runtime config keys that keep a throw-away `nodus runtime` (or `nodus node`/`nodus up`)
//! off host-wide paths. NRI is on by default and its socket, `/var/run/nri/nri.sock`, is one
//! per host: parallel test runtimes (and a containerd beside them) would contend for it, and
//! plugins installed on the host would be started for every test. Each test runtime gets
//! its own socket and an empty plugin directory under its temp dir instead.

use std::path::Path;

/// `nri-socket` and `nri-plugin-path` under `dir`, for the keys `config` does not set yet
/// (TOML refuses a key given twice); top-level keys, so they go before any table.
pub fn private_nri(dir: &Path, config: &str) -> String {
    let mut keys = String::new();
    let set = |key: &str| config.lines().any(|l| l.trim_start().starts_with(key));
    if !set("nri-socket") {
        keys.push_str(&format!(
            "nri-socket = \"{}\"\n",
            dir.join("nri").join("nri.sock").display()
        ));
    }
    if !set("nri-plugin-path") {
        keys.push_str(&format!(
            "nri-plugin-path = \"{}\"\n",
            dir.join("nri").join("plugins").display()
        ));
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_only_the_keys_the_config_lacks() {
        let d = Path::new("/t");
        assert_eq!(
            private_nri(d, ""),
            "nri-socket = \"/t/nri/nri.sock\"\nnri-plugin-path = \"/t/nri/plugins\"\n"
        );
        assert_eq!(
            private_nri(d, "nri = true\nnri-socket = \"/x.sock\"\n"),
            "nri-plugin-path = \"/t/nri/plugins\"\n"
        );
    }
}
