//! Partial syncs touch only the changed service, never list the kernel's table, and a
//! service the kernel refuses costs only that service.

mod fixture;

use fixture::*;
use nodus_proxy::backend::{Backend, Runner};
use nodus_proxy::model::Protocol;
use nodus_proxy::nftables::Nftables;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
struct Fake {
    applied: Arc<Mutex<Vec<String>>>,
    lists: Arc<Mutex<usize>>,
    /// Transactions mentioning this text fail, as a kernel refusing a rule would.
    refuse: Option<String>,
}

impl Runner for Fake {
    fn apply(&mut self, text: &str) -> Result<(), String> {
        if let Some(r) = &self.refuse
            && text.contains(r.as_str())
        {
            return Err(format!("Error: Could not process rule: {r}"));
        }
        if let Ok(mut g) = self.applied.lock() {
            g.push(text.to_string());
        }
        Ok(())
    }
    fn list(&mut self) -> Option<String> {
        if let Ok(mut n) = self.lists.lock() {
            *n += 1;
        }
        None
    }
}

fn last(f: &Fake) -> String {
    f.applied
        .lock()
        .ok()
        .and_then(|g| g.last().cloned())
        .unwrap_or_default()
}

#[test]
fn one_changed_endpoint_rewrites_only_that_service() {
    let fake = Fake::default();
    let mut b = Nftables::new(Box::new(fake.clone()));
    let mut snap = snapshot();
    b.full_sync(&snap, &ctx()).expect("full");
    let lists_after_full = *fake.lists.lock().expect("lock");
    let web = name("web", "http", Protocol::Tcp);
    if let Some(e) = snap.get_mut(&web) {
        e.endpoints[1] = ep(20, false);
    }
    let out = b
        .partial_sync(&snap, &ctx(), &BTreeSet::from([web]))
        .expect("partial");
    assert_eq!(out.transactions, 1);
    let t = last(&fake);
    // Without session affinity a ClusterIP's endpoints are elements of one map: the change
    // is one element out, one in, and the new endpoint's hairpin pair; no rule, no chain.
    assert!(
        t.contains(
            "delete element ip kube-proxy service-endpoints-tcp { 10.96.0.10 . 80 . 32768-65535 }"
        ),
        "{t}"
    );
    assert!(
        t.contains(
            "add element ip kube-proxy service-endpoints-tcp { 10.96.0.10 . 80 . 32768-65535 : 10.244.0.20 . 8080 }"
        ),
        "{t}"
    );
    assert!(
        t.contains("add element ip kube-proxy endpoint-hairpin { 10.244.0.20 . 10.244.0.20 }"),
        "{t}"
    );
    for other in [
        "/np/",
        "/lb/",
        "/sticky/",
        "/dns/",
        "service-ips",
        "rule",
        "chain",
    ] {
        assert!(!t.contains(other), "{other} touched:\n{t}");
    }
    // A service with session affinity keeps a chain per endpoint: the old one goes.
    let sticky = name("sticky", "http", Protocol::Tcp);
    if let Some(e) = snap.get_mut(&sticky) {
        e.endpoints[1] = ep(21, false);
    }
    b.partial_sync(&snap, &ctx(), &BTreeSet::from([sticky]))
        .expect("partial");
    let t = last(&fake);
    assert!(
        t.contains("delete chain ip kube-proxy endpoint-"),
        "old endpoint chain deleted:\n{t}"
    );
    assert!(t.contains("dnat to 10.244.0.21:8080"), "{t}");
    assert_eq!(
        *fake.lists.lock().expect("lock"),
        lists_after_full,
        "partial sync listed the table"
    );

    // An unchanged resync sends nothing at all.
    let all: BTreeSet<_> = snap.keys().cloned().collect();
    let out = b.partial_sync(&snap, &ctx(), &all).expect("noop");
    assert_eq!(out.transactions, 0);
}

#[test]
fn added_and_removed_service_change_only_their_elements() {
    let fake = Fake::default();
    let mut b = Nftables::new(Box::new(fake.clone()));
    let mut snap = snapshot();
    b.full_sync(&snap, &ctx()).expect("full");
    let p = port("new", [10, 96, 0, 99], 80);
    let n = p.name.clone();
    snap.insert(
        n.clone(),
        nodus_proxy::model::ServiceEntry {
            port: p,
            endpoints: vec![ep(30, false)],
        },
    );
    b.partial_sync(&snap, &ctx(), &BTreeSet::from([n.clone()]))
        .expect("add");
    let t = last(&fake);
    assert!(
        t.contains(
            "add element ip kube-proxy service-endpoints-tcp { 10.96.0.99 . 80 . 0-65535 : 10.244.0.30 . 8080 }"
        ),
        "{t}"
    );
    assert!(!t.contains("rule") && !t.contains("chain"), "{t}");
    assert!(
        t.contains("add element ip kube-proxy cluster-ips { 10.96.0.99 }"),
        "{t}"
    );
    assert!(!t.contains("flush map"), "{t}");
    snap.remove(&n);
    b.partial_sync(&snap, &ctx(), &BTreeSet::from([n]))
        .expect("remove");
    let t = last(&fake);
    assert!(
        t.contains(
            "delete element ip kube-proxy service-endpoints-tcp { 10.96.0.99 . 80 . 0-65535 }"
        ),
        "{t}"
    );
    assert!(
        t.contains("delete element ip kube-proxy cluster-ips { 10.96.0.99 }"),
        "{t}"
    );
}

#[test]
fn a_refused_service_does_not_cost_the_others() {
    let fake = Fake {
        refuse: Some("default/sticky/".into()),
        ..Default::default()
    };
    let mut b = Nftables::new(Box::new(fake.clone()));
    let snap = snapshot();
    let out = b
        .full_sync(&snap, &ctx())
        .expect("full sync still succeeds");
    assert_eq!(out.failed.len(), 1, "{:?}", out.failed);
    assert_eq!(out.failed[0].0.name, "sticky");
    let t = last(&fake);
    assert!(
        t.contains("10.96.0.10 . 80 . 0-32767 : 10.244.0.11 . 8080"),
        "web programmed:\n{t}"
    );
    assert!(
        !t.contains("10.96.0.14"),
        "refused service has no map elements:\n{t}"
    );
}

#[test]
fn shared_cluster_ip_stays_while_one_port_remains() {
    let fake = Fake::default();
    let mut b = Nftables::new(Box::new(fake.clone()));
    let mut snap = snapshot();
    let mut second = port("web", [10, 96, 0, 10], 8443);
    second.name = name("web", "https", Protocol::Tcp);
    let n2 = second.name.clone();
    snap.insert(
        n2.clone(),
        nodus_proxy::model::ServiceEntry {
            port: second,
            endpoints: vec![ep(11, true)],
        },
    );
    b.full_sync(&snap, &ctx()).expect("full");
    snap.remove(&n2);
    b.partial_sync(&snap, &ctx(), &BTreeSet::from([n2]))
        .expect("remove port");
    let t = last(&fake);
    assert!(!t.contains("cluster-ips"), "the VIP still has a port:\n{t}");
}
