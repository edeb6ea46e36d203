//! Golden files of the rule text each backend renders for a fixed set of services
//! (tests/fixture.rs). Regenerate with `UPDATE_GOLDEN=1 cargo test -p nodus-proxy --test
//! golden` and review the diff. As root, the nftables text is also checked by the kernel
//! (`nft -c`) in a throwaway network namespace.

mod fixture;

use nodus_proxy::backend::{Backend, Runner};
use nodus_proxy::{iptables, nftables};
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<String>>>);

impl Runner for Recorder {
    fn apply(&mut self, text: &str) -> Result<(), String> {
        if let Ok(mut g) = self.0.lock() {
            g.push(text.to_string());
        }
        Ok(())
    }
    fn list(&mut self) -> Option<String> {
        None
    }
}

fn check(file: &str, got: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(file);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, got).expect("write golden");
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        want == got,
        "{} differs from the rendering; rerun with UPDATE_GOLDEN=1 and review.\n--- got ---\n{got}",
        path.display()
    );
}

fn full_text(b: &mut dyn Backend, rec: &Recorder) -> String {
    b.full_sync(&fixture::snapshot(), &fixture::ctx())
        .expect("sync");
    rec.0.lock().map(|g| g.join("")).unwrap_or_default()
}

#[test]
fn nftables_rendering_matches_golden() {
    let rec = Recorder::default();
    let mut b = nftables::Nftables::new(Box::new(rec.clone()));
    let text = full_text(&mut b, &rec);
    check("nftables.nft", &text);
    if nix_is_root() {
        let out = std::process::Command::new("unshare")
            .args(["--net", "sh", "-c", "nft -c -f /dev/stdin"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write as _;
                if let Some(mut i) = c.stdin.take() {
                    i.write_all(text.as_bytes())?;
                }
                c.wait_with_output()
            })
            .expect("nft -c");
        assert!(
            out.status.success(),
            "the kernel rejects the golden text: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn iptables_rendering_matches_golden() {
    let rec = Recorder::default();
    let mut b = iptables::Iptables::new(Box::new(rec.clone()));
    // ensure_jumps would run iptables on the host: render only.
    let snap = fixture::snapshot();
    let ctx = fixture::ctx();
    let frags: Vec<(nodus_proxy::model::ServicePortName, iptables::Fragment)> = snap
        .iter()
        .map(|(n, e)| (n.clone(), iptables::render_service(e, &ctx)))
        .collect();
    let refs = frags.iter().map(|(n, f)| (n, f)).collect();
    let write = frags
        .iter()
        .flat_map(|(_, f)| f.nat_chains.clone())
        .collect();
    let text = iptables::Iptables::render(&refs, &ctx, &write, &Default::default());
    let _ = &mut b;
    check("iptables.rules", &text);
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
