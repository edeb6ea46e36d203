//! The store's behaviour, checked against every backend: the embedded redb store and a real
//! etcd member started for the test (on free 127.0.0.1 ports, in a temp dir, stopped when
//! the test ends). Revisions are compared to the store's own starting revision: a fresh etcd
//! starts at 1, the embedded store at 0.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::mpsc;

use super::etcd::{EtcdConfig, EtcdServer, EtcdStore};
use super::{EmbeddedStore, Event, EventKind, MutateOp, Mutation, Store, StoreError, Stored};

/// A store under test and what keeps it alive.
pub(crate) struct Backend {
    pub store: Arc<dyn Store>,
    pub(crate) dir: tempfile::TempDir,
    _etcd: Option<EtcdServer>,
}

pub(crate) fn embedded() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&dir.path().join("store.redb")).unwrap();
    Backend {
        store: Arc::new(store),
        dir,
        _etcd: None,
    }
}

pub(crate) fn etcd() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let server = EtcdServer::start(&dir.path().join("etcd"))
        .unwrap_or_else(|e| panic!("starting etcd for the test: {e}"));
    let store = EtcdStore::connect(&EtcdConfig::new(vec![server.url()])).unwrap();
    Backend {
        store: Arc::new(store),
        dir,
        _etcd: Some(server),
    }
}

/// etcd behind the watch cache, as the API server opens it.
pub(crate) fn cached_etcd() -> Backend {
    let b = etcd();
    Backend {
        store: Arc::new(super::Cacher::new(b.store)),
        dir: b.dir,
        _etcd: b._etcd,
    }
}

fn recv(rx: &mut mpsc::Receiver<Arc<Event>>) -> Arc<Event> {
    let start = Instant::now();
    loop {
        match rx.try_recv() {
            Ok(e) => return e,
            Err(mpsc::error::TryRecvError::Empty) if start.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("no watch event: {e:?}"),
        }
    }
}

macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod on_embedded {
            $(#[test] fn $name() { super::$name(&super::embedded()); })*
        }
        mod on_etcd {
            $(#[test] fn $name() { super::$name(&super::etcd()); })*
        }
        mod on_cached_etcd {
            $(#[test] fn $name() { super::$name(&super::cached_etcd()); })*
        }
    };
}

both!(
    create_update_conflict_and_list,
    a_batch_applies_in_order_and_skips_refused_operations,
    watch_replays_then_streams_with_prev_and_compaction_gives_gone,
    lists_span_many_pages_at_one_revision,
    concurrent_read_modify_writes_lose_nothing,
);

fn create_update_conflict_and_list(b: &Backend) {
    let s = &*b.store;
    let base = s.revision();
    let a = s
        .create("/core/pods/default/a", json!({"metadata": {"name": "a"}}))
        .unwrap();
    assert_eq!(a.revision, base + 1);
    assert_eq!(
        a.object["metadata"]["resourceVersion"],
        (base + 1).to_string()
    );
    assert!(matches!(
        s.create("/core/pods/default/a", json!({})),
        Err(StoreError::AlreadyExists(_))
    ));
    let b2 = s
        .update(
            "/core/pods/default/a",
            json!({"metadata": {"name": "a"}, "x": 1}),
            Some(a.revision),
        )
        .unwrap();
    assert_eq!(b2.revision, base + 2);
    match s.update("/core/pods/default/a", json!({}), Some(a.revision)) {
        Err(StoreError::Conflict { current, .. }) => assert_eq!(current, b2.revision),
        other => panic!("expected Conflict, got {:?}", other.map(|_| ())),
    }
    assert!(matches!(
        s.update("/core/pods/default/missing", json!({}), None),
        Err(StoreError::NotFound(_))
    ));
    let got = s.get("/core/pods/default/a").unwrap().unwrap();
    assert_eq!(got.object["x"], 1);
    assert_eq!(
        got.object["metadata"]["resourceVersion"],
        (base + 2).to_string()
    );
    assert!(s.get("/core/pods/default/nope").unwrap().is_none());
    s.create("/core/pods/other/c", json!({})).unwrap();
    s.create("/apps/deployments/default/d", json!({})).unwrap();
    let (items, rev) = s.list("/core/pods/default/").unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(rev, base + 4);
    let (items, _) = s.list("/core/pods/").unwrap();
    let keys: Vec<&str> = items.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(keys, ["/core/pods/default/a", "/core/pods/other/c"]);
    let (all, _) = s.list("/").unwrap();
    assert_eq!(all.len(), 3);
    assert!(matches!(
        s.delete("/core/pods/default/a", Some(a.revision)),
        Err(StoreError::Conflict { .. })
    ));
    let gone = s.delete("/core/pods/default/a", Some(b2.revision)).unwrap();
    assert_eq!(gone.revision, base + 5);
    assert!(s.get("/core/pods/default/a").unwrap().is_none());
    assert!(matches!(
        s.delete("/core/pods/default/a", None),
        Err(StoreError::NotFound(_))
    ));
}

pub(crate) fn a_batch_applies_in_order_and_skips_refused_operations(b: &Backend) {
    let s = &*b.store;
    s.create("/core/pods/default/b", json!({"metadata": {"name": "b"}}))
        .unwrap();
    let base = s.revision();
    let mut rx = s.watch("/core/pods/", base).unwrap();
    let mut ops: Vec<MutateOp<'_>> = vec![
        (
            "/core/pods/default/a".into(),
            Box::new(|_cur: Option<&Stored>| {
                Ok(Mutation::Put(json!({"metadata": {"name": "a"}, "n": 1})))
            }),
        ),
        // Sees what the first operation wrote.
        (
            "/core/pods/default/a".into(),
            Box::new(|cur: Option<&Stored>| {
                let mut v = (*cur.expect("a").object).clone();
                v["n"] = json!(v["n"].as_i64().unwrap_or(0) + 1);
                Ok(Mutation::Put(v))
            }),
        ),
        (
            "/core/pods/default/missing".into(),
            Box::new(|_cur: Option<&Stored>| Err(StoreError::NotFound("missing".into()))),
        ),
        (
            "/core/pods/default/b".into(),
            Box::new(|_cur: Option<&Stored>| Ok(Mutation::Delete)),
        ),
    ];
    let out = s.mutate_many(&mut ops).unwrap();
    assert!(out[0].is_ok() && out[1].is_ok() && out[3].is_ok());
    assert!(matches!(out[2], Err(StoreError::NotFound(_))));
    let a = out[1].as_ref().unwrap().stored.clone().unwrap();
    assert_eq!(a.object["n"], 2);
    assert_eq!(a.revision, base + 2);
    let deleted = out[3].as_ref().unwrap().deleted.clone().unwrap();
    assert_eq!(deleted.revision, base + 3);
    let kinds: Vec<(EventKind, u64)> = (0..3)
        .map(|_| {
            let e = recv(&mut rx);
            (e.kind, e.revision)
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            (EventKind::Added, base + 1),
            (EventKind::Modified, base + 2),
            (EventKind::Deleted, base + 3)
        ]
    );
    assert_eq!(
        s.get("/core/pods/default/a").unwrap().unwrap().object["n"],
        2
    );
    assert!(s.get("/core/pods/default/b").unwrap().is_none());
}

fn watch_replays_then_streams_with_prev_and_compaction_gives_gone(b: &Backend) {
    let s = &*b.store;
    let base = s.revision();
    s.create(
        "/core/pods/ns/a",
        json!({"metadata": {"name": "a"}, "v": 1}),
    )
    .unwrap();
    s.create("/core/configmaps/ns/x", json!({})).unwrap();
    let mut rx = s.watch("/core/pods/", base).unwrap();
    s.update(
        "/core/pods/ns/a",
        json!({"metadata": {"name": "a"}, "v": 2}),
        None,
    )
    .unwrap();
    s.delete("/core/pods/ns/a", None).unwrap();
    let added = recv(&mut rx);
    assert_eq!((added.kind, added.revision), (EventKind::Added, base + 1));
    assert_eq!(added.key, "/core/pods/ns/a");
    assert!(added.prev.is_none());
    let modified = recv(&mut rx);
    assert_eq!(
        (modified.kind, modified.revision),
        (EventKind::Modified, base + 3)
    );
    assert_eq!(modified.object["v"], 2);
    assert_eq!(modified.prev.as_ref().unwrap()["v"], 1);
    let deleted = recv(&mut rx);
    assert_eq!(
        (deleted.kind, deleted.revision),
        (EventKind::Deleted, base + 4)
    );
    // The last state, at the deletion's revision.
    assert_eq!(deleted.object["v"], 2);
    assert_eq!(
        deleted.object["metadata"]["resourceVersion"],
        (base + 4).to_string()
    );
    assert_eq!(deleted.prev.as_ref().unwrap()["v"], 2);
    s.compact(base + 2).unwrap();
    assert_eq!(s.oldest_watchable(), base + 2);
    match s.watch("/core/pods/", base + 1) {
        Err(e @ StoreError::Compacted { .. }) => assert_eq!(
            e.to_string(),
            format!("too old resource version: {} ({})", base + 1, base + 3)
        ),
        other => panic!("expected Compacted, got {:?}", other.map(|_| ())),
    }
    let mut rx = s.watch("/core/pods/", base + 2).unwrap();
    assert_eq!(recv(&mut rx).revision, base + 3);
}

fn lists_span_many_pages_at_one_revision(b: &Backend) {
    let s = &*b.store;
    let mut ops: Vec<MutateOp<'_>> = (0..1100)
        .map(|i| -> MutateOp<'_> {
            (
                format!("/core/configmaps/ns/cm-{i:05}"),
                Box::new(move |_: Option<&Stored>| Ok(Mutation::Put(json!({"i": i})))),
            )
        })
        .collect();
    for r in s.mutate_many(&mut ops).unwrap() {
        r.unwrap();
    }
    let (items, rev) = s.list("/core/configmaps/ns/").unwrap();
    assert_eq!(items.len(), 1100);
    assert_eq!(rev, s.revision());
    assert!(items.windows(2).all(|w| w[0].key < w[1].key));
    assert_eq!(items[1099].object["i"], 1099);
}

fn concurrent_read_modify_writes_lose_nothing(b: &Backend) {
    let key = "/core/configmaps/ns/counter";
    b.store.create(key, json!({"n": 0})).unwrap();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let s = b.store.clone();
            std::thread::spawn(move || {
                for _ in 0..10 {
                    s.mutate(key, &mut |cur| {
                        let mut v = (*cur.unwrap().object).clone();
                        v["n"] = json!(v["n"].as_i64().unwrap() + 1);
                        Ok(Mutation::Put(v))
                    })
                    .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(b.store.get(key).unwrap().unwrap().object["n"], 80);
}

/// Polls `f` until it succeeds; panics with the last error after 30 s.
fn eventually<T>(what: &str, mut f: impl FnMut() -> Result<T, StoreError>) -> T {
    let start = Instant::now();
    loop {
        match f() {
            Ok(v) => return v,
            Err(_) if start.elapsed() < Duration::from_secs(30) => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

/// Three etcd members: the store loses the one it uses and goes on through the next, as
/// kube-apiserver does with several `--etcd-servers`.
#[test]
fn etcd_store_fails_over_to_the_next_member() {
    let dir = tempfile::tempdir().unwrap();
    let mut members = EtcdServer::start_cluster(&dir.path().join("etcd"), 3)
        .unwrap_or_else(|e| panic!("starting a 3-member etcd: {e}"));
    let urls: Vec<String> = members.iter().map(EtcdServer::url).collect();
    let store = EtcdStore::connect(&EtcdConfig::new(urls.clone())).unwrap();
    assert_eq!(store.server(), urls[0]);
    let cm = |name: &str| json!({"metadata": {"name": name, "namespace": "default"}});
    // A fresh cluster may still be electing its leader.
    eventually("the first write", || {
        store.create("/core/configmaps/default/before", cm("before"))
    });
    let from = store.revision();
    let mut rx = store.watch("/core/configmaps/", from).unwrap();

    members[0].stop();
    // The watch on the lost member ends: its consumer re-watches from its last revision.
    let start = Instant::now();
    loop {
        match rx.try_recv() {
            Err(mpsc::error::TryRecvError::Disconnected) => break,
            _ if start.elapsed() > Duration::from_secs(30) => {
                panic!("the watch on the stopped member did not end")
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let before = eventually("a read after the loss", || {
        store.get("/core/configmaps/default/before")
    });
    assert!(before.is_some(), "the object written before is gone");
    assert_eq!(store.server(), urls[1], "the next member took over");
    let after = eventually("a write after the loss", || {
        store.create("/core/configmaps/default/after", cm("after"))
    });
    let mut rx = store.watch("/core/configmaps/", from).unwrap();
    let ev = recv(&mut rx);
    assert_eq!(ev.key, "/core/configmaps/default/after");
    assert_eq!(ev.revision, after.revision);
}

/// The watch cache hands every list and watcher the same decoded objects (one copy of the
/// cluster in memory, not one per consumer), and a list is never older than a write that
/// returned before it.
#[test]
fn the_watch_cache_shares_objects_and_reads_its_writes() {
    let b = cached_etcd();
    let s = &*b.store;
    for i in 0..50 {
        let key = format!("/core/pods/ns/p{i}");
        s.create(&key, json!({"metadata": {"name": format!("p{i}")}}))
            .unwrap();
        // Read-your-writes: each list sees the create that just returned.
        let (items, rev) = s.list("/core/pods/").unwrap();
        assert_eq!(items.len(), i + 1);
        assert!(rev >= s.revision() - 1, "{rev}");
    }
    let mut rx = s.watch("/core/pods/", s.revision()).unwrap();
    s.update(
        "/core/pods/ns/p0",
        json!({"metadata": {"name": "p0"}, "v": 2}),
        None,
    )
    .unwrap();
    let ev = recv(&mut rx);
    let (a, _) = s.list("/core/pods/ns/p0").unwrap();
    let (b2, _) = s.list("/core/pods/").unwrap();
    assert_eq!(a[0].object["v"], 2);
    assert!(
        Arc::ptr_eq(&a[0].object, &b2[0].object),
        "lists share objects"
    );
    assert!(
        Arc::ptr_eq(&a[0].object, &ev.object),
        "watchers share them too"
    );
}

/// A watch cache over `server` holding `/core/configmaps/ns/a`, and a store of another
/// prefix of the same etcd, whose writes move etcd's revision without an event the cache sees.
fn cache_and_neighbour(server: &EtcdServer) -> (super::Cacher, EtcdStore) {
    let etcd: Arc<dyn Store> =
        Arc::new(EtcdStore::connect(&EtcdConfig::new(vec![server.url()])).unwrap());
    let mut other_cfg = EtcdConfig::new(vec![server.url()]);
    other_cfg.prefix = "/other".into();
    let other = EtcdStore::connect(&other_cfg).unwrap();
    let s = super::Cacher::new(etcd);
    s.create("/core/configmaps/ns/a", json!({})).unwrap();
    (s, other)
}

/// etcd's revision moved by a write the cache never sees (another prefix of the same etcd):
/// the list does not wait for ever, it reads etcd. An etcd restart empties nothing: the
/// cache lists again and its watchers are closed so they re-watch.
#[test]
fn the_watch_cache_falls_back_to_etcd_and_recovers_from_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let port = |_| {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (client, peer) = (port(0), port(1));
    let data = dir.path().join("etcd");
    let mut server = EtcdServer::start_on(&data, client, peer).unwrap();
    let (s, other) = cache_and_neighbour(&server);
    assert_eq!(s.list("/core/configmaps/").unwrap().0.len(), 1);
    other.create("/core/configmaps/ns/b", json!({})).unwrap();
    let started = Instant::now();
    let (items, rev) = s.list("/core/configmaps/").unwrap();
    assert_eq!(items.len(), 1, "only this prefix");
    assert_eq!(rev, other.revision(), "read from etcd at its revision");
    assert!(started.elapsed() < super::cacher::CATCH_UP * 5);

    let mut rx = s.watch("/core/configmaps/", rev).unwrap();
    server.stop();
    let start = Instant::now();
    loop {
        match rx.try_recv() {
            Err(mpsc::error::TryRecvError::Disconnected) => break,
            _ if start.elapsed() > Duration::from_secs(30) => {
                panic!("the cache's watcher was not closed when etcd went away")
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let _server = EtcdServer::start_on(&data, client, peer).unwrap();
    eventually("a write after the restart", || {
        s.create("/core/configmaps/ns/c", json!({}))
    });
    let (items, _) = eventually("a list after the restart", || s.list("/core/configmaps/"));
    let keys: Vec<&str> = items.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(keys, ["/core/configmaps/ns/a", "/core/configmaps/ns/c"]);
}

/// Progress for bookmarks: a watcher of a quiet prefix that asked for it is told the
/// revision moved on — by the cache, for writes under the prefixes it holds; by etcd's
/// progress notifications, for writes the cache never sees (another prefix of the same
/// etcd) — and never ahead of an event it is owed. A plain watcher gets events only.
#[test]
fn quiet_watchers_are_told_the_revision_moved_on() {
    let dir = tempfile::tempdir().unwrap();
    let server = EtcdServer::start(&dir.path().join("etcd")).unwrap();
    let (s, other) = cache_and_neighbour(&server);
    let (_, rev) = s.list("/core/configmaps/").unwrap();
    let mut rx = s.watch_progress("/core/configmaps/", rev).unwrap();
    let mut plain = s.watch("/core/configmaps/", rev).unwrap();

    let pod = s.create("/core/pods/ns/p", json!({})).unwrap();
    let ev = recv(&mut rx);
    assert!(ev.is_progress(), "{ev:?}");
    assert!(
        ev.revision >= pod.revision,
        "{} < {}",
        ev.revision,
        pod.revision
    );

    let cm = s.create("/core/configmaps/ns/b", json!({})).unwrap();
    let ev = recv(&mut rx);
    assert!(!ev.is_progress(), "{ev:?}");
    assert_eq!(
        (ev.key.as_str(), ev.revision),
        ("/core/configmaps/ns/b", cm.revision)
    );

    let foreign = other.create("/core/configmaps/ns/x", json!({})).unwrap();
    let started = Instant::now();
    loop {
        let ev = recv(&mut rx);
        assert!(ev.is_progress(), "{ev:?}");
        if ev.revision >= foreign.revision {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no progress past the foreign write"
        );
    }

    assert_eq!(recv(&mut plain).key, "/core/configmaps/ns/b");
    assert!(plain.try_recv().is_err(), "a plain watcher gets no markers");
}
