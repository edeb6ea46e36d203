//! The nftables backend through the in-process libnftables context against a real kernel,
//! in a network namespace private to the test's thread (as root): syncs program the table,
//! a transaction the kernel refuses comes back as that service's failure with the kernel's
//! message, the idle step's cache warm-up changes nothing, and the context keeps working
//! afterwards.

mod fixture;

use fixture::*;
use nodus_proxy::backend::Backend;
use nodus_proxy::libnft::Context;
use nodus_proxy::model::Protocol;
use nodus_proxy::nftables::{NftRunner, Nftables};
use std::collections::BTreeSet;

/// Whether these tests can run here: as root, with libnftables installed. CI
/// (NODUS_TEST_REQUIRE_ROOT set) has both, so there a missing one is a failure, not a skip.
fn can_test() -> bool {
    let required = std::env::var_os("NODUS_TEST_REQUIRE_ROOT").is_some();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            !required,
            "this test needs root and NODUS_TEST_REQUIRE_ROOT is set"
        );
        return false;
    }
    if !nodus_proxy::libnft::available() {
        // The library is optional at run time; the nft -f path is what runs then.
        assert!(
            !required,
            "libnftables.so.1 is missing (Debian's nftables package brings it)"
        );
        eprintln!("libnftables.so.1 not installed; nothing to test");
        return false;
    }
    true
}

/// Runs `f` on a thread of its own in a fresh network namespace (gone when it ends), so
/// nothing touches the host's tables.
fn in_private_netns(f: impl FnOnce() + Send + 'static) {
    let t = std::thread::spawn(move || {
        // SAFETY: unshare on this thread only; CLONE_NEWNET takes no pointers.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "unshare: {}", std::io::Error::last_os_error());
        f();
    });
    if let Err(e) = t.join() {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn libnftables_programs_the_kernel_and_reports_refusals() {
    if !can_test() {
        return;
    }
    in_private_netns(|| {
        let mut look = Context::new().expect("context");
        let mut b = Nftables::new(Box::new(NftRunner::new()));
        let mut snap = snapshot();
        let out = b.full_sync(&snap, &ctx()).expect("full sync");
        assert!(out.failed.is_empty(), "{:?}", out.failed);

        // A partial sync through the library lands in the kernel.
        let web = name("web", "http", Protocol::Tcp);
        if let Some(e) = snap.get_mut(&web) {
            e.endpoints[1] = ep(20, false);
        }
        let out = b
            .partial_sync(&snap, &ctx(), &BTreeSet::from([web.clone()]))
            .expect("partial sync");
        assert!(out.failed.is_empty(), "{:?}", out.failed);
        assert_eq!(out.transactions, 1);
        let table = look.run("list table ip kube-proxy").expect("list");
        assert!(table.contains(": 10.244.0.20 . 8080"), "{table}");

        // The idle step's dry run leaves the kernel's table exactly as it was.
        b.idle();
        let after_idle = look.run("list table ip kube-proxy").expect("list");
        assert_eq!(after_idle, table, "the cache warm-up changed the table");
        assert!(!after_idle.contains("127.0.0.1"), "{after_idle}");

        // The kernel refuses the next change (its table is gone): the failure names the
        // service and carries the kernel's reason.
        look.run("delete table ip kube-proxy")
            .expect("delete table");
        if let Some(e) = snap.get_mut(&web) {
            e.endpoints[1] = ep(21, false);
        }
        let out = b
            .partial_sync(&snap, &ctx(), &BTreeSet::from([web.clone()]))
            .expect("partial sync");
        assert_eq!(out.failed.len(), 1, "{:?}", out.failed);
        assert_eq!(out.failed[0].0, web);
        assert!(
            out.failed[0].1.contains("No such file or directory"),
            "{}",
            out.failed[0].1
        );

        // The same context still works, and the refusal's message does not leak into the
        // next result: a full sync rebuilds everything.
        let out = b.full_sync(&snap, &ctx()).expect("full sync after refusal");
        assert!(out.failed.is_empty(), "{:?}", out.failed);
        let table = look.run("list table ip kube-proxy").expect("list");
        assert!(table.contains(": 10.244.0.21 . 8080"), "{table}");
        assert!(!table.contains("Error"), "{table}");
    });
}

#[test]
fn a_refused_command_returns_the_kernel_message_and_the_context_stays_usable() {
    if !can_test() {
        return;
    }
    in_private_netns(|| {
        let mut c = Context::new().expect("context");
        let err = c
            .run("add rule ip nodus-libnft-test nowhere accept\n")
            .expect_err("no such table");
        assert!(err.contains("No such file or directory"), "{err}");
        assert!(
            c.run("add rule ip x y accept\0").is_err(),
            "a NUL byte is refused, not truncated"
        );
        c.run("add table ip nodus-libnft-test\nadd chain ip nodus-libnft-test c\nadd rule ip nodus-libnft-test c accept\n")
            .expect("valid transaction after an error");
        let listed = c.run("list table ip nodus-libnft-test").expect("list");
        assert!(listed.contains("chain c"), "{listed}");
        assert!(!listed.contains("Error"), "{listed}");
    });
}
