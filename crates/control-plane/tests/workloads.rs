//! The ReplicaSet, ReplicationController and Deployment controllers against the real API
//! server, without nodes: pods stay Pending (unscheduled) unless the test plays kubelet
//! and marks them Running/Ready through the status subresource. Ownership and adoption,
//! scale-down ranking, rollouts (rolling and Recreate), proportional scaling, history
//! cleanup, validation 422s and a restart mid-rollout; `kubectl describe` of every workload
//! kind.

mod common;

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Event, Pod, ReplicationController};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use common::{eventually, eventually_n};

async fn pods_of(pods: &Api<Pod>, selector: &str) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(selector))
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

fn name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

/// Plays kubelet for one pod: Running and (not) Ready.
async fn set_ready(pods: &Api<Pod>, pod: &str, ready: bool) {
    let st = if ready { "True" } else { "False" };
    let _ = pods
        .patch_status(
            pod,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running",
                "conditions": [{"type": "Ready", "status": st,
                    "lastTransitionTime": "2020-01-01T00:00:00Z"}]}})),
        )
        .await;
}

/// Marks every pod of `selector` that is not Ready yet Running and Ready.
async fn ready_all(pods: &Api<Pod>, selector: &str) {
    for p in pods_of(pods, selector).await {
        let ready = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if !ready {
            set_ready(pods, &name(&p), true).await;
        }
    }
}

fn rs_json(name: &str, replicas: i64, labels: Value) -> ReplicaSet {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
    }))
    .expect("rs")
}

fn deploy_json(name: &str, replicas: i64, image: &str) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": image}]}}}
    }))
    .expect("deployment")
}

async fn events_for(events: &Api<Event>, name: &str) -> Vec<(String, String)> {
    events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_set_owns_adopts_releases_and_ranks() {
    let c = common::start().await;
    let client = c.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), "default");
    let events: Api<Event> = Api::namespaced(client.clone(), "default");

    // An orphan that the set will adopt.
    let orphan: Pod = serde_json::from_value(
        json!({"metadata": {"name": "orphan", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
    )
    .expect("pod");
    pods.create(&PostParams::default(), &orphan)
        .await
        .expect("orphan");
    let rs = sets
        .create(
            &PostParams::default(),
            &rs_json("web", 3, json!({"app": "web"})),
        )
        .await
        .expect("create rs");
    let uid = rs.metadata.uid.clone().unwrap_or_default();
    let owned = eventually("3 pods", || async {
        let ps = pods_of(&pods, "app=web").await;
        (ps.len() == 3).then_some(ps)
    })
    .await;
    for p in &owned {
        let refs = p.metadata.owner_references.clone().unwrap_or_default();
        assert_eq!(refs.len(), 1, "{:?}", p.metadata);
        assert_eq!(refs[0].uid, uid);
        assert_eq!(refs[0].kind, "ReplicaSet");
        assert_eq!(refs[0].controller, Some(true));
        assert_eq!(refs[0].block_owner_deletion, Some(true));
        let n = name(p);
        if n != "orphan" {
            assert!(n.starts_with("web-") && n.len() == 9, "{n}");
        }
    }
    assert!(owned.iter().any(|p| name(p) == "orphan"), "orphan adopted");
    let st = eventually("status replicas 3", || async {
        let rs = sets.get("web").await.ok()?;
        let st = rs.status?;
        (st.replicas == 3
            && st.fully_labeled_replicas == Some(3)
            && st.observed_generation == Some(1))
        .then_some(st)
    })
    .await;
    assert_eq!(st.ready_replicas.unwrap_or(0), 0);
    let evs = events_for(&events, "web").await;
    assert_eq!(
        evs.iter()
            .filter(|(r, m)| r == "SuccessfulCreate" && m.starts_with("Created pod: web-"))
            .count(),
        2,
        "{evs:?}"
    );

    // Release: relabel one owned pod; the set lets go of it and makes a replacement.
    let created: Vec<String> = owned.iter().map(name).filter(|n| n != "orphan").collect();
    pods.patch(
        &created[0],
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "other"}}})),
    )
    .await
    .expect("relabel");
    eventually("released and replaced", || async {
        let p = pods.get(&created[0]).await.ok()?;
        let released = p.metadata.owner_references.unwrap_or_default().is_empty();
        (released && pods_of(&pods, "app=web").await.len() == 3).then_some(())
    })
    .await;

    // Ranking: one not-ready pod, one ready, one ready with a high deletion cost.
    let ps: Vec<String> = pods_of(&pods, "app=web").await.iter().map(name).collect();
    set_ready(&pods, &ps[0], false).await;
    set_ready(&pods, &ps[1], true).await;
    set_ready(&pods, &ps[2], true).await;
    pods.patch(
        &ps[2],
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations":
        {"controller.kubernetes.io/pod-deletion-cost": "100"}}})),
    )
    .await
    .expect("cost");
    eventually("ready 2", || async {
        let st = sets.get("web").await.ok()?.status?;
        (st.ready_replicas == Some(2) && st.available_replicas == Some(2)).then_some(())
    })
    .await;
    sets.patch_scale(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 1}})),
    )
    .await
    .expect("scale");
    let left = eventually("one pod left", || async {
        let ps = pods_of(&pods, "app=web").await;
        (ps.len() == 1).then_some(ps)
    })
    .await;
    assert_eq!(name(&left[0]), ps[2], "the costly ready pod is kept");
    let evs = events_for(&events, "web").await;
    assert!(
        evs.iter()
            .any(|(r, m)| r == "SuccessfulDelete" && m == &format!("Deleted pod: {}", ps[0])),
        "{evs:?}"
    );

    // Deleting the set deletes its pods (garbage collection through the owner refs).
    sets.delete("web", &DeleteParams::default())
        .await
        .expect("delete rs");
    eventually("pods gone", || async {
        pods_of(&pods, "app=web").await.is_empty().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_controller_runs_on_the_same_controller() {
    let c = common::start().await;
    let client = c.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let rcs: Api<ReplicationController> = Api::namespaced(client.clone(), "default");
    // No selector: it defaults to the template's labels, as do the labels.
    let rc: ReplicationController = serde_json::from_value(json!({"metadata": {"name": "legacy"},
        "spec": {"replicas": 2, "template": {"metadata": {"labels": {"app": "legacy"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}))
    .expect("rc");
    let created = rcs
        .create(&PostParams::default(), &rc)
        .await
        .expect("create rc");
    let spec = created.spec.clone().unwrap_or_default();
    assert_eq!(
        spec.selector,
        Some(BTreeMap::from([("app".to_string(), "legacy".to_string())]))
    );
    assert_eq!(created.metadata.labels, spec.selector);
    let ps = eventually("2 pods", || async {
        let ps = pods_of(&pods, "app=legacy").await;
        (ps.len() == 2).then_some(ps)
    })
    .await;
    for p in &ps {
        let r = &p.metadata.owner_references.clone().unwrap_or_default()[0];
        assert_eq!(
            (r.kind.as_str(), r.api_version.as_str()),
            ("ReplicationController", "v1")
        );
    }
    let out = c.kubectl(&["scale", "rc", "legacy", "--replicas=3"]).await;
    out.ok();
    eventually("3 pods", || async {
        (pods_of(&pods, "app=legacy").await.len() == 3).then_some(())
    })
    .await;
    let out = c.kubectl(&["get", "rc", "legacy"]).await;
    let text = out.ok().to_string();
    let header: Vec<&str> = text
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(header, ["NAME", "DESIRED", "CURRENT", "READY", "AGE"]);
    eventually("kubectl shows 3 current", || async {
        let out = c.kubectl(&["get", "rc", "legacy", "--no-headers"]).await;
        let cols: Vec<String> = out.stdout.split_whitespace().map(str::to_string).collect();
        (cols.get(1).map(String::as_str) == Some("3")
            && cols.get(2).map(String::as_str) == Some("3"))
        .then_some(())
    })
    .await;
}

/// Plays kubelet for every pod of `app` until the deployment reports a finished rollout.
async fn roll_until_complete(
    pods: &Api<Pod>,
    deploys: &Api<Deployment>,
    app: &str,
    replicas: i32,
) -> Deployment {
    eventually_n("rollout complete", 600, || async {
        ready_all(pods, &format!("app={app}")).await;
        let d = deploys.get(app).await.ok()?;
        let st = d.status.clone()?;
        let done = st.observed_generation >= d.metadata.generation
            && st.updated_replicas == Some(replicas)
            && st.replicas == Some(replicas)
            && st.available_replicas == Some(replicas);
        done.then_some(d)
    })
    .await
}

fn condition(d: &Deployment, ty: &str) -> (String, String, String) {
    d.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == ty))
        .map(|c| {
            (
                c.status.clone(),
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
        .unwrap_or_default()
}

async fn sets_of(sets: &Api<ReplicaSet>, app: &str) -> Vec<ReplicaSet> {
    let mut l = sets
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .expect("list rs")
        .items;
    l.sort_by_key(|r| {
        r.metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .get("deployment.kubernetes.io/revision")
            .cloned()
            .unwrap_or_default()
    });
    l
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_rolls_out_scales_and_cleans_up() {
    let c = common::start().await;
    let client = c.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), "default");
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let mut d = deploy_json("web", 4, "busybox:1");
    if let Some(s) = d.spec.as_mut() {
        s.revision_history_limit = Some(1);
    }
    deploys
        .create(&PostParams::default(), &d)
        .await
        .expect("create");
    let done = roll_until_complete(&pods, &deploys, "web", 4).await;
    assert_eq!(
        condition(&done, "Available"),
        (
            "True".into(),
            "MinimumReplicasAvailable".into(),
            "Deployment has minimum availability.".into()
        )
    );
    let rs1 = sets_of(&sets, "web").await;
    assert_eq!(rs1.len(), 1);
    let rs1_name = rs1[0].metadata.name.clone().unwrap_or_default();
    let hash = rs1[0]
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .get("pod-template-hash")
        .cloned()
        .unwrap_or_default();
    assert_eq!(rs1_name, format!("web-{hash}"));
    let ann = rs1[0].metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        ann.get("deployment.kubernetes.io/revision")
            .map(String::as_str),
        Some("1")
    );
    assert_eq!(
        ann.get("deployment.kubernetes.io/desired-replicas")
            .map(String::as_str),
        Some("4")
    );
    assert_eq!(
        ann.get("deployment.kubernetes.io/max-replicas")
            .map(String::as_str),
        Some("5")
    );
    for p in pods_of(&pods, "app=web").await {
        assert_eq!(
            p.metadata
                .labels
                .unwrap_or_default()
                .get("pod-template-hash"),
            Some(&hash)
        );
    }
    assert_eq!(
        condition(&done, "Progressing"),
        (
            "True".into(),
            "NewReplicaSetAvailable".into(),
            format!("ReplicaSet \"{rs1_name}\" has successfully progressed.")
        )
    );
    let evs = events_for(&events, "web").await;
    assert!(
        evs.contains(&(
            "ScalingReplicaSet".into(),
            format!("Scaled up replica set {rs1_name} from 0 to 4")
        )),
        "{evs:?}"
    );

    // A new template: a rolling update within maxSurge 1 / maxUnavailable 1 (25% of 4).
    deploys
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"spec":
        {"containers": [{"name": "c", "image": "busybox:2"}]}}}})),
        )
        .await
        .expect("new image");
    let max_total = std::sync::atomic::AtomicI32::new(0);
    let done = eventually_n("rolling update", 600, || {
        let (sets, pods, deploys, max_total) = (&sets, &pods, &deploys, &max_total);
        async move {
            let all = sets_of(sets, "web").await;
            let total: i32 = all
                .iter()
                .map(|r| r.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0))
                .sum();
            max_total.fetch_max(total, std::sync::atomic::Ordering::SeqCst);
            ready_all(pods, "app=web").await;
            let d = deploys.get("web").await.ok()?;
            let st = d.status.clone()?;
            (st.observed_generation >= d.metadata.generation
                && st.updated_replicas == Some(4)
                && st.replicas == Some(4)
                && st.available_replicas == Some(4))
            .then_some(d)
        }
    })
    .await;
    let max_total = max_total.into_inner();
    assert!(
        max_total <= 5,
        "never more than replicas + maxSurge: {max_total}"
    );
    let all = sets_of(&sets, "web").await;
    assert_eq!(all.len(), 2, "revisionHistoryLimit 1 keeps one old set");
    let old = all
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(&rs1_name))
        .expect("old rs");
    assert_eq!(old.spec.as_ref().and_then(|s| s.replicas), Some(0));
    assert_eq!(
        done.metadata
            .annotations
            .unwrap_or_default()
            .get("deployment.kubernetes.io/revision")
            .map(String::as_str),
        Some("2")
    );

    // Scaled mid-rollout: the new template's pods never become ready, so both sets stay.
    deploys
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"spec":
        {"containers": [{"name": "c", "image": "busybox:3"}]}}}})),
        )
        .await
        .expect("third image");
    eventually("third set surged", || async {
        let all = sets_of(&sets, "web").await;
        let sizes: Vec<i32> = all
            .iter()
            .map(|r| r.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0))
            .collect();
        // Old 0, previous 3 (one went for the surge), new 2 that never become ready.
        (sizes == [0, 3, 2]).then_some(())
    })
    .await;
    deploys
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 8}})),
        )
        .await
        .expect("scale");
    let sizes = eventually("proportional", || async {
        let all = sets_of(&sets, "web").await;
        let sizes: Vec<i32> = all
            .iter()
            .map(|r| r.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0))
            .collect();
        (sizes.iter().sum::<i32>() == 10).then_some(sizes)
    })
    .await;
    // Max replicas went 5 → 10 (8 + 2): each active set doubled.
    assert_eq!(sizes[1..], [6, 4], "{sizes:?}");

    // Validation.
    let bad = deploys
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"strategy":
        {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 0}}}})),
        )
        .await;
    let msg = match bad {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422);
            e.message
        }
        other => panic!("expected 422, got {other:?}"),
    };
    assert!(msg.contains("spec.strategy.rollingUpdate.maxUnavailable: Invalid value: 0: may not be 0 when `maxSurge` is 0"), "{msg}");
    let bad = deploys.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"selector":
        {"matchLabels": {"app": "web", "x": "y"}}, "template": {"metadata": {"labels": {"app": "web", "x": "y"}}}}})))
    .await;
    match bad {
        Err(kube::Error::Api(e)) => assert!(
            e.code == 422
                && e.message.contains("spec.selector: Invalid value")
                && e.message.contains("field is immutable"),
            "{}",
            e.message
        ),
        other => panic!("expected 422, got {other:?}"),
    }
    let bad = deploys
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": -1}})),
        )
        .await;
    match bad {
        Err(kube::Error::Api(e)) => assert!(
            e.code == 422
                && e.message.contains(
                    "spec.replicas: Invalid value: -1: must be greater than or equal to 0"
                ),
            "{}",
            e.message
        ),
        other => panic!("expected 422, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recreate_waits_for_old_pods() {
    let c = common::start().await;
    let client = c.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), "default");
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let mut d = deploy_json("rec", 2, "busybox:1");
    if let Some(s) = d.spec.as_mut() {
        s.strategy = serde_json::from_value(json!({"type": "Recreate"})).ok();
    }
    deploys
        .create(&PostParams::default(), &d)
        .await
        .expect("create");
    roll_until_complete(&pods, &deploys, "rec", 2).await;
    deploys
        .patch(
            "rec",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"spec":
        {"containers": [{"name": "c", "image": "busybox:2"}]}}}})),
        )
        .await
        .expect("new image");
    eventually_n("recreated", 600, || async {
        let all = sets_of(&sets, "rec").await;
        let sizes: Vec<i32> = all
            .iter()
            .map(|r| r.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0))
            .collect();
        // Never both sets with replicas at once.
        assert!(sizes.iter().filter(|s| **s > 0).count() <= 1, "{sizes:?}");
        (sizes == [0, 2]).then_some(())
    })
    .await;
    roll_until_complete(&pods, &deploys, "rec", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_mid_rollout_makes_no_extra_pods() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = common::start_in(dir.path(), Default::default()).await;
    let client = common::client_for(&first.kubeconfig).await;
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    deploys
        .create(&PostParams::default(), &deploy_json("r", 3, "busybox:1"))
        .await
        .expect("create");
    roll_until_complete(&pods, &deploys, "r", 3).await;
    deploys
        .patch(
            "r",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"spec":
        {"containers": [{"name": "c", "image": "busybox:2"}]}}}})),
        )
        .await
        .expect("new image");
    // The surge pod exists (not ready): stop here, mid-rollout.
    eventually("surge pod", || async {
        (pods_of(&pods, "app=r").await.len() == 4).then_some(())
    })
    .await;
    first.shutdown().await;

    let second = common::start_in(dir.path(), Default::default()).await;
    let client = common::client_for(&second.kubeconfig).await;
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let peak = std::sync::atomic::AtomicUsize::new(0);
    eventually_n("rollout finished after restart", 600, || {
        let (pods, deploys, peak) = (&pods, &deploys, &peak);
        async move {
            let n = pods_of(pods, "app=r").await.len();
            peak.fetch_max(n, std::sync::atomic::Ordering::SeqCst);
            ready_all(pods, "app=r").await;
            let d = deploys.get("r").await.ok()?;
            let st = d.status.clone()?;
            (st.observed_generation >= d.metadata.generation
                && st.updated_replicas == Some(3)
                && st.replicas == Some(3)
                && st.available_replicas == Some(3))
            .then_some(())
        }
    })
    .await;
    let peak = peak.into_inner();
    assert!(peak <= 4, "at most replicas + maxSurge pods: {peak}");
    assert_eq!(pods_of(&pods, "app=r").await.len(), 3);
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_creations_set_replica_failure_and_back_off() {
    let c = common::start().await;
    let client = c.client().await;
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), "default");
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // Admission refuses every pod of this template (no such PriorityClass).
    let mut rs = rs_json("bad", 2, json!({"app": "bad"}));
    if let Some(t) = rs
        .spec
        .as_mut()
        .and_then(|s| s.template.as_mut())
        .and_then(|t| t.spec.as_mut())
    {
        t.priority_class_name = Some("missing".into());
    }
    sets.create(&PostParams::default(), &rs)
        .await
        .expect("create rs");
    let cond = eventually("ReplicaFailure", || async {
        let st = sets.get("bad").await.ok()?.status?;
        st.conditions?
            .into_iter()
            .find(|c| c.type_ == "ReplicaFailure")
    })
    .await;
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_deref()),
        ("True", Some("FailedCreate"))
    );
    assert!(
        cond.message
            .unwrap_or_default()
            .contains("no PriorityClass with name missing was found")
    );
    let evs = events_for(&events, "bad").await;
    assert!(
        evs.iter().any(|(r, m)| r == "FailedCreate"
            && m.starts_with("Error creating: ")
            && m.contains("missing")),
        "{evs:?}"
    );
    assert!(pods_of(&pods, "app=bad").await.is_empty());
    // Backing off, not spinning: a few seconds bring a handful of attempts, not hundreds.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let count: i32 = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some("bad")
                && e.reason.as_deref() == Some("FailedCreate")
        })
        .map(|e| e.count.unwrap_or(1))
        .sum();
    assert!(count < 20, "{count} failed creations in a few seconds");
    // Fixed template (the PriorityClass appears): pods come, the condition goes.
    let pc = json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": "missing"}, "value": 10});
    c.apply(&serde_json::to_string(&pc).expect("pc")).await.ok();
    eventually_n("pods after the fix", 900, || async {
        let st = sets.get("bad").await.ok()?.status?;
        let gone = st
            .conditions
            .unwrap_or_default()
            .iter()
            .all(|c| c.type_ != "ReplicaFailure");
        (gone && st.replicas == 2).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_rollout_exceeds_its_progress_deadline() {
    let c = common::start().await;
    let client = c.client().await;
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), "default");
    let mut d = deploy_json("stuck", 2, "busybox");
    if let Some(s) = d.spec.as_mut() {
        s.progress_deadline_seconds = Some(2);
    }
    deploys
        .create(&PostParams::default(), &d)
        .await
        .expect("create");
    // Nobody marks the pods ready: the deadline passes.
    let d = eventually("ProgressDeadlineExceeded", || async {
        let d = deploys.get("stuck").await.ok()?;
        (condition(&d, "Progressing").1 == "ProgressDeadlineExceeded").then_some(d)
    })
    .await;
    let rs = sets_of(&sets, "stuck").await;
    let rs_name = rs[0].metadata.name.clone().unwrap_or_default();
    assert_eq!(
        condition(&d, "Progressing"),
        (
            "False".into(),
            "ProgressDeadlineExceeded".into(),
            format!("ReplicaSet \"{rs_name}\" has timed out progressing.")
        )
    );
    assert_eq!(
        condition(&d, "Available"),
        (
            "False".into(),
            "MinimumReplicasUnavailable".into(),
            "Deployment does not have minimum availability.".into()
        )
    );
    let out = c
        .kubectl(&["rollout", "status", "deployment/stuck", "--timeout=10s"])
        .await;
    assert!(
        out.fails()
            .contains("deployment \"stuck\" exceeded its progress deadline"),
        "{}",
        out.stderr
    );
}

/// `kubectl describe <args>` once its output holds every one of `wants` (the controllers
/// may still be catching up).
async fn describe(c: &common::Cluster, args: &[&str], wants: &[&str]) -> String {
    let mut full = vec!["describe"];
    full.extend_from_slice(args);
    let mut last = String::new();
    for _ in 0..300 {
        let out = c.kubectl(&full).await;
        if wants.iter().all(|w| out.stdout.contains(w)) {
            return out.stdout;
        }
        last = format!("{}{}", out.stdout, out.stderr);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("kubectl describe {args:?} never showed all of {wants:?}:\n{last}");
}

/// `kubectl describe` on each workload kind names its key fields and the controller's
/// events about it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_describe_shows_workloads_and_their_events() {
    let c = common::start().await;
    c.apply(
        r#"
apiVersion: v1
kind: Node
metadata: {name: n1, labels: {kubernetes.io/hostname: n1}}
status:
  allocatable: {cpu: "4", memory: 4Gi, pods: "110"}
  capacity: {cpu: "4", memory: 4Gi, pods: "110"}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: c, image: busybox}]}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    # n1 has no kubelet: once its grace period runs out it is tainted unreachable, and a
    # pod that does not tolerate that no longer counts the node as desired.
    spec: {containers: [{name: c, image: busybox}], tolerations: [{operator: Exists}]}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  serviceName: db
  replicas: 1
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec: {containers: [{name: c, image: busybox}]}
---
apiVersion: batch/v1
kind: Job
metadata: {name: once}
spec:
  completions: 3
  parallelism: 2
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: busybox}]
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly}
spec:
  schedule: "0 3 * * *"
  timeZone: Etc/UTC
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          containers: [{name: c, image: busybox}]
"#,
    )
    .await
    .ok();
    let d = describe(
        &c,
        &["deployment", "web"],
        &[
            "Replicas:",
            "2 desired | 2 updated | 2 total",
            "StrategyType:           RollingUpdate",
            "25% max unavailable, 25% max surge",
            "NewReplicaSet:",
            "ScalingReplicaSet",
            "Scaled up replica set web-",
        ],
    )
    .await;
    // The ReplicaSet it names, described in turn.
    let rs = d
        .lines()
        .find(|l| l.starts_with("NewReplicaSet:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .expect("new replica set named")
        .to_string();
    describe(
        &c,
        &["replicaset", &rs],
        &[
            "Controlled By:  Deployment/web",
            "2 current / 2 desired",
            "Pods Status:",
            "SuccessfulCreate",
            "Created pod: web-",
        ],
    )
    .await;
    describe(
        &c,
        &["daemonset", "agent"],
        &[
            "Desired Number of Nodes Scheduled: 1",
            "Current Number of Nodes Scheduled: 1",
            "SuccessfulCreate",
            "Created pod: agent-",
        ],
    )
    .await;
    describe(
        &c,
        &["statefulset", "db"],
        &[
            "1 desired | 1 total",
            "Update Strategy:",
            "RollingUpdate",
            "SuccessfulCreate",
            "create Pod db-0 in StatefulSet db successful",
        ],
    )
    .await;
    describe(
        &c,
        &["job", "once"],
        &[
            "Parallelism:",
            "Completions:",
            "Pods Statuses:",
            "SuccessfulCreate",
            "Created pod: once-",
        ],
    )
    .await;
    describe(
        &c,
        &["cronjob", "nightly"],
        &[
            "Schedule:",
            "0 3 * * *",
            "Concurrency Policy:",
            "Allow",
            "Suspend:",
        ],
    )
    .await;
}
