//! batch/v1 against the real API server, kubectl and the in-process Job, CronJob and
//! TTL-after-finished controllers. No kubelet runs here: a test finishes a pod by writing
//! its status through the status subresource, as a kubelet would.

mod common;

use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use common::{eventually, eventually_n};

fn job_json(name: &str, spec: Value) -> Value {
    let mut j = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox", "command": ["true"]}]}}}});
    if let (Some(dst), Some(src)) = (j["spec"].as_object_mut(), spec.as_object()) {
        for (k, v) in src {
            dst.insert(k.clone(), v.clone());
        }
    }
    j
}

async fn create_job(jobs: &Api<Job>, name: &str, spec: Value) -> Job {
    let j: Job = serde_json::from_value(job_json(name, spec)).expect("job");
    jobs.create(&PostParams::default(), &j)
        .await
        .expect("create job")
}

/// The Job's pods that are not being deleted, oldest first.
async fn live_pods(pods: &Api<Pod>, job: &str) -> Vec<Pod> {
    let mut items = pods
        .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}")))
        .await
        .expect("pods")
        .items;
    items.retain(|p| p.metadata.deletion_timestamp.is_none());
    items.sort_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0));
    items
}

async fn finish_pod(pods: &Api<Pod>, name: &str, phase: &str, exit_code: i64) {
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": phase, "containerStatuses": [{
            "name": "main", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": exit_code, "reason": if exit_code == 0 { "Completed" } else { "Error" },
                "startedAt": "2024-01-01T00:00:00Z", "finishedAt": k8s_now()}}}]}})),
    )
    .await
    .expect("pod status");
}

fn k8s_now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .expect("round")
        .to_string()
}

fn condition<'a>(job: &'a Job, ty: &str) -> Option<&'a k8s_openapi::api::batch::v1::JobCondition> {
    job.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == ty && c.status == "True")
}

async fn wait_condition(jobs: &Api<Job>, name: &str, ty: &str, tries: usize) -> Job {
    eventually_n(&format!("job {name} {ty}"), tries, || async {
        let j = jobs.get(name).await.ok()?;
        condition(&j, ty).is_some().then_some(j)
    })
    .await
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
async fn kubectl_create_job_runs_to_complete_with_generated_selector() {
    let c = common::start().await;
    let client = c.client().await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let events: Api<Event> = Api::namespaced(client.clone(), "default");

    c.kubectl(&["create", "job", "pi", "--image=busybox", "--", "true"])
        .await
        .ok();
    let j: Value = serde_json::from_str(c.kubectl(&["get", "job", "pi", "-o", "json"]).await.ok())
        .expect("json");
    let uid = j["metadata"]["uid"].as_str().expect("uid").to_string();
    let spec = &j["spec"];
    assert_eq!(spec["completions"], json!(1));
    assert_eq!(spec["parallelism"], json!(1));
    assert_eq!(spec["backoffLimit"], json!(6));
    assert_eq!(spec["completionMode"], json!("NonIndexed"));
    assert_eq!(spec["suspend"], json!(false));
    assert_eq!(spec["manualSelector"], json!(false));
    assert_eq!(spec["podReplacementPolicy"], json!("TerminatingOrFailed"));
    assert_eq!(
        spec["selector"],
        json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})
    );
    for (k, v) in [
        ("batch.kubernetes.io/controller-uid", uid.as_str()),
        ("controller-uid", uid.as_str()),
        ("batch.kubernetes.io/job-name", "pi"),
        ("job-name", "pi"),
    ] {
        assert_eq!(spec["template"]["metadata"]["labels"][k], json!(v), "{k}");
        assert_eq!(j["metadata"]["labels"][k], json!(v), "{k}");
    }

    let pod = eventually("the job's pod", || async {
        live_pods(&pods, "pi").await.into_iter().next()
    })
    .await;
    let name = pod.metadata.name.clone().expect("name");
    assert!(name.starts_with("pi-"), "{name}");
    assert_eq!(
        pod.metadata.finalizers.clone().unwrap_or_default(),
        vec!["batch.kubernetes.io/job-tracking".to_string()]
    );
    let owner = &pod.metadata.owner_references.clone().unwrap_or_default()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("Job", uid.as_str(), Some(true))
    );
    let running = eventually("status.active 1", || async {
        let j = jobs.get("pi").await.ok()?;
        (j.status.as_ref()?.active == Some(1)).then_some(j)
    })
    .await;
    assert!(
        running
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .is_some()
    );
    let table = c.kubectl(&["get", "jobs"]).await.ok().to_string();
    assert!(
        table.starts_with("NAME   STATUS    COMPLETIONS   DURATION   AGE"),
        "{table}"
    );
    assert!(table.contains("Running   0/1"), "{table}");

    finish_pod(&pods, &name, "Succeeded", 0).await;
    let done = wait_condition(&jobs, "pi", "Complete", 300).await;
    let st = done.status.clone().expect("status");
    assert_eq!(st.succeeded, Some(1));
    assert_eq!(st.active, None);
    assert!(st.completion_time.is_some());
    let complete = condition(&done, "Complete").expect("Complete");
    assert_eq!(complete.reason.as_deref(), Some("CompletionsReached"));
    assert_eq!(
        complete.message.as_deref(),
        Some("Reached expected number of succeeded pods")
    );
    assert!(condition(&done, "SuccessCriteriaMet").is_some());
    // Counted, so the finalizer is gone.
    eventually("finalizer removed", || async {
        let p = pods.get(&name).await.ok()?;
        p.metadata
            .finalizers
            .unwrap_or_default()
            .is_empty()
            .then_some(())
    })
    .await;
    let table = c.kubectl(&["get", "jobs"]).await.ok().to_string();
    assert!(table.contains("Complete   1/1"), "{table}");
    let evs = events_for(&events, "pi").await;
    assert!(
        evs.contains(&("SuccessfulCreate".into(), format!("Created pod: {name}"))),
        "{evs:?}"
    );
    assert!(
        evs.contains(&("Completed".into(), "Job completed".into())),
        "{evs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_and_indexed_jobs() {
    let c = common::start().await;
    let client = c.client().await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    create_job(&jobs, "par", json!({"completions": 4, "parallelism": 2})).await;
    let mut finished = 0;
    while finished < 4 {
        let batch = eventually("two running pods", || async {
            let ps = live_pods(&pods, "par").await;
            let running: Vec<Pod> = ps
                .into_iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending"))
                .collect();
            (running.len() == 2.min(4 - finished)).then_some(running)
        })
        .await;
        // Never more than parallelism at once.
        assert!(batch.len() <= 2);
        for p in &batch {
            finish_pod(
                &pods,
                p.metadata.name.as_deref().expect("name"),
                "Succeeded",
                0,
            )
            .await;
            finished += 1;
        }
    }
    let done = wait_condition(&jobs, "par", "Complete", 300).await;
    assert_eq!(done.status.and_then(|s| s.succeeded), Some(4));
    let table = c.kubectl(&["get", "job", "par"]).await.ok().to_string();
    assert!(table.contains("Complete   4/4"), "{table}");

    create_job(
        &jobs,
        "idx",
        json!({"completions": 3, "parallelism": 3, "completionMode": "Indexed"}),
    )
    .await;
    let ps = eventually("three indexed pods", || async {
        let ps = live_pods(&pods, "idx").await;
        (ps.len() == 3).then_some(ps)
    })
    .await;
    let mut indexes: Vec<String> = Vec::new();
    for p in &ps {
        let ix = p.metadata.annotations.clone().unwrap_or_default()["batch.kubernetes.io/job-completion-index"].clone();
        assert_eq!(
            p.metadata.labels.clone().unwrap_or_default()["batch.kubernetes.io/job-completion-index"],
            ix
        );
        let spec = p.spec.clone().expect("spec");
        assert_eq!(spec.hostname, Some(format!("idx-{ix}")));
        let env = spec.containers[0].env.clone().unwrap_or_default();
        assert!(
            env.iter().any(|e| e.name == "JOB_COMPLETION_INDEX"),
            "{env:?}"
        );
        assert!(
            p.metadata
                .name
                .as_deref()
                .expect("name")
                .starts_with(&format!("idx-{ix}-"))
        );
        indexes.push(ix);
    }
    indexes.sort();
    assert_eq!(indexes, ["0", "1", "2"]);
    // Index 1 first: completedIndexes says so.
    let by_index = |ix: &str| {
        ps.iter()
            .find(|p| p.metadata.annotations.clone().unwrap_or_default()["batch.kubernetes.io/job-completion-index"] == ix)
            .and_then(|p| p.metadata.name.clone())
            .expect("pod of index")
    };
    finish_pod(&pods, &by_index("1"), "Succeeded", 0).await;
    eventually("completedIndexes 1", || async {
        let j = jobs.get("idx").await.ok()?;
        (j.status?.completed_indexes.as_deref() == Some("1")).then_some(())
    })
    .await;
    finish_pod(&pods, &by_index("0"), "Succeeded", 0).await;
    finish_pod(&pods, &by_index("2"), "Succeeded", 0).await;
    let done = wait_condition(&jobs, "idx", "Complete", 300).await;
    let st = done.status.expect("status");
    assert_eq!(st.completed_indexes.as_deref(), Some("0-2"));
    assert_eq!(st.succeeded, Some(3));
}

fn annotation(p: &Pod, key: &str) -> Option<String> {
    p.metadata.annotations.as_ref()?.get(key).cloned()
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// The Job's live pods of completion index `ix`, oldest first.
async fn index_pods(pods: &Api<Pod>, job: &str, ix: u32) -> Vec<Pod> {
    live_pods(pods, job)
        .await
        .into_iter()
        .filter(|p| {
            annotation(p, "batch.kubernetes.io/job-completion-index") == Some(ix.to_string())
        })
        .collect()
}

/// The one running (not finished) pod of index `ix`.
async fn running_pod_of(pods: &Api<Pod>, job: &str, ix: u32) -> Pod {
    eventually_n(&format!("a pod of {job} index {ix}"), 400, || async {
        index_pods(pods, job, ix)
            .await
            .into_iter()
            .find(|p| !matches!(phase(p), "Succeeded" | "Failed"))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn success_policy_declares_an_indexed_job_complete_and_stops_the_rest() {
    let c = common::start().await;
    let client = c.client().await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let events: Api<Event> = Api::namespaced(client.clone(), "default");

    // Done once index 0 (the leader) succeeded, whatever the workers do.
    create_job(
        &jobs,
        "leader",
        json!({"completions": 4, "parallelism": 4, "completionMode": "Indexed",
            "successPolicy": {"rules": [{"succeededIndexes": "0"}]}}),
    )
    .await;
    eventually("four pods", || async {
        (live_pods(&pods, "leader").await.len() == 4).then_some(())
    })
    .await;
    // A worker finishing first meets no rule.
    let worker = running_pod_of(&pods, "leader", 2).await;
    finish_pod(
        &pods,
        worker.metadata.name.as_deref().expect("name"),
        "Succeeded",
        0,
    )
    .await;
    eventually("completedIndexes 2", || async {
        let j = jobs.get("leader").await.ok()?;
        (j.status?.completed_indexes.as_deref() == Some("2")).then_some(())
    })
    .await;
    assert!(
        condition(
            &jobs.get("leader").await.expect("job"),
            "SuccessCriteriaMet"
        )
        .is_none()
    );
    assert_eq!(live_pods(&pods, "leader").await.len(), 4);

    let leader = running_pod_of(&pods, "leader", 0).await;
    finish_pod(
        &pods,
        leader.metadata.name.as_deref().expect("name"),
        "Succeeded",
        0,
    )
    .await;
    let done = wait_condition(&jobs, "leader", "Complete", 300).await;
    for ty in ["SuccessCriteriaMet", "Complete"] {
        let cond = condition(&done, ty).unwrap_or_else(|| panic!("{ty}"));
        assert_eq!(cond.reason.as_deref(), Some("SuccessPolicy"), "{ty}");
        assert_eq!(
            cond.message.as_deref(),
            Some("Matched rules at index 0"),
            "{ty}"
        );
    }
    let st = done.status.clone().expect("status");
    assert_eq!(st.completed_indexes.as_deref(), Some("0,2"));
    assert_eq!(st.succeeded, Some(2));
    assert_eq!(st.active, None);
    assert!(st.completion_time.is_some());
    // The workers of indexes 1 and 3 were stopped, and not counted as failures.
    assert_eq!(st.failed, None);
    eventually("the lingering pods removed", || async {
        let left: Vec<String> = live_pods(&pods, "leader")
            .await
            .iter()
            .map(|p| annotation(p, "batch.kubernetes.io/job-completion-index").unwrap_or_default())
            .collect();
        (left == ["2", "0"] || left == ["0", "2"]).then_some(())
    })
    .await;
    let table = c.kubectl(&["get", "job", "leader"]).await.ok().to_string();
    assert!(table.contains("Complete   2/4"), "{table}");
    let reason = c
        .kubectl(&[
            "get",
            "job",
            "leader",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Complete\")].reason}",
        ])
        .await
        .ok()
        .to_string();
    assert_eq!(reason, "SuccessPolicy");
    let evs = events_for(&events, "leader").await;
    assert!(
        evs.contains(&("Completed".into(), "Job completed".into())),
        "{evs:?}"
    );

    // succeededCount alone: any two indexes.
    create_job(
        &jobs,
        "quorum",
        json!({"completions": 3, "parallelism": 3, "completionMode": "Indexed",
            "successPolicy": {"rules": [{"succeededCount": 2}]}}),
    )
    .await;
    for ix in [2, 1] {
        let p = running_pod_of(&pods, "quorum", ix).await;
        finish_pod(
            &pods,
            p.metadata.name.as_deref().expect("name"),
            "Succeeded",
            0,
        )
        .await;
    }
    let done = wait_condition(&jobs, "quorum", "Complete", 300).await;
    assert_eq!(
        condition(&done, "Complete").and_then(|c| c.reason.as_deref()),
        Some("SuccessPolicy")
    );
    assert_eq!(
        done.status.and_then(|s| s.completed_indexes).as_deref(),
        Some("1,2")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backoff_limit_per_index_retries_each_index_on_its_own() {
    let c = common::start().await;
    let client = c.client().await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    const COUNT: &str = "batch.kubernetes.io/job-index-failure-count";

    create_job(
        &jobs,
        "perix",
        json!({"completions": 3, "parallelism": 3, "completionMode": "Indexed",
            "backoffLimitPerIndex": 1}),
    )
    .await;
    let j = jobs.get("perix").await.expect("job");
    // The global limit steps aside (upstream's default with a per-index limit).
    assert_eq!(
        j.spec.as_ref().and_then(|s| s.backoff_limit),
        Some(i32::MAX)
    );
    let first = running_pod_of(&pods, "perix", 1).await;
    assert_eq!(annotation(&first, COUNT).as_deref(), Some("0"));
    let first_name = first.metadata.name.clone().expect("name");
    finish_pod(&pods, &first_name, "Failed", 1).await;
    // Index 1 alone is retried, after its own back-off, carrying its failure count; the
    // failed pod keeps its finalizer until then.
    let second = running_pod_of(&pods, "perix", 1).await;
    assert_ne!(second.metadata.name.as_deref(), Some(first_name.as_str()));
    assert_eq!(annotation(&second, COUNT).as_deref(), Some("1"));
    eventually("the first failure counted once replaced", || async {
        let j = jobs.get("perix").await.ok()?;
        let st = j.status?;
        (st.failed == Some(1) && st.failed_indexes.as_deref() == Some("")).then_some(())
    })
    .await;
    for ix in [0, 2] {
        assert_eq!(index_pods(&pods, "perix", ix).await.len(), 1, "index {ix}");
        let p = running_pod_of(&pods, "perix", ix).await;
        finish_pod(
            &pods,
            p.metadata.name.as_deref().expect("name"),
            "Succeeded",
            0,
        )
        .await;
    }
    // The second failure uses up index 1's limit: no third pod, and the Job fails.
    finish_pod(
        &pods,
        second.metadata.name.as_deref().expect("name"),
        "Failed",
        1,
    )
    .await;
    let failed = wait_condition(&jobs, "perix", "Failed", 300).await;
    for ty in ["FailureTarget", "Failed"] {
        let cond = condition(&failed, ty).unwrap_or_else(|| panic!("{ty}"));
        assert_eq!(cond.reason.as_deref(), Some("FailedIndexes"), "{ty}");
        assert_eq!(
            cond.message.as_deref(),
            Some("Job has failed indexes"),
            "{ty}"
        );
    }
    let st = failed.status.clone().expect("status");
    assert_eq!(st.failed_indexes.as_deref(), Some("1"));
    assert_eq!(st.completed_indexes.as_deref(), Some("0,2"));
    assert_eq!((st.succeeded, st.failed), (Some(2), Some(2)));
    assert_eq!(index_pods(&pods, "perix", 1).await.len(), 2);
    let table = c.kubectl(&["get", "job", "perix"]).await.ok().to_string();
    assert!(table.contains("Failed   2/3"), "{table}");
    let evs = events_for(&events, "perix").await;
    assert!(
        evs.contains(&("FailedIndexes".into(), "Job has failed indexes".into())),
        "{evs:?}"
    );

    // FailIndex fails an index at once; a second failed index is one more than allowed.
    create_job(
        &jobs,
        "maxfail",
        json!({"completions": 4, "parallelism": 4, "completionMode": "Indexed",
            "backoffLimitPerIndex": 2, "maxFailedIndexes": 1,
            "podFailurePolicy": {"rules": [{"action": "FailIndex",
                "onExitCodes": {"operator": "In", "values": [42]}}]}}),
    )
    .await;
    let p0 = running_pod_of(&pods, "maxfail", 0).await;
    finish_pod(
        &pods,
        p0.metadata.name.as_deref().expect("name"),
        "Failed",
        42,
    )
    .await;
    eventually("failedIndexes 0", || async {
        let j = jobs.get("maxfail").await.ok()?;
        (j.status?.failed_indexes.as_deref() == Some("0")).then_some(())
    })
    .await;
    let j = jobs.get("maxfail").await.expect("job");
    assert!(condition(&j, "FailureTarget").is_none(), "{j:?}");
    assert_eq!(
        index_pods(&pods, "maxfail", 0).await.len(),
        1,
        "index 0 is not retried"
    );
    let p3 = running_pod_of(&pods, "maxfail", 3).await;
    finish_pod(
        &pods,
        p3.metadata.name.as_deref().expect("name"),
        "Failed",
        42,
    )
    .await;
    let failed = wait_condition(&jobs, "maxfail", "Failed", 300).await;
    let cond = condition(&failed, "Failed").expect("Failed");
    assert_eq!(cond.reason.as_deref(), Some("MaxFailedIndexesExceeded"));
    assert_eq!(
        cond.message.as_deref(),
        Some("Job has exceeded the specified maximal number of failed indexes")
    );
    let st = failed.status.expect("status");
    assert_eq!(st.failed_indexes.as_deref(), Some("0,3"));
    // The pods of indexes 1 and 2 were stopped.
    eventually("remaining pods removed", || async {
        let left = live_pods(&pods, "maxfail").await;
        left.iter().all(|p| phase(p) == "Failed").then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_back_off_then_fail_the_job_and_a_quickly_deleted_pod_still_counts() {
    let c = common::start().await;
    let client = c.client().await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let events: Api<Event> = Api::namespaced(client.clone(), "default");

    create_job(&jobs, "fail", json!({"backoffLimit": 1})).await;
    let first = eventually("first pod", || async {
        live_pods(&pods, "fail").await.into_iter().next()
    })
    .await;
    let first_name = first.metadata.name.clone().expect("name");
    finish_pod(&pods, &first_name, "Failed", 1).await;
    eventually("failed 1", || async {
        let j = jobs.get("fail").await.ok()?;
        (j.status?.failed == Some(1)).then_some(())
    })
    .await;
    // The replacement waits out the 10 s back-off, then comes.
    let second = eventually_n("replacement pod", 400, || async {
        live_pods(&pods, "fail")
            .await
            .into_iter()
            .find(|p| p.metadata.name.as_deref() != Some(first_name.as_str()))
    })
    .await;
    assert!(
        jobs.get("fail")
            .await
            .expect("job")
            .status
            .and_then(|s| s.active)
            == Some(1)
    );
    finish_pod(
        &pods,
        second.metadata.name.as_deref().expect("name"),
        "Failed",
        1,
    )
    .await;
    let failed = wait_condition(&jobs, "fail", "Failed", 300).await;
    let cond = condition(&failed, "Failed").expect("Failed");
    assert_eq!(cond.reason.as_deref(), Some("BackoffLimitExceeded"));
    assert_eq!(
        cond.message.as_deref(),
        Some("Job has reached the specified backoff limit")
    );
    assert!(condition(&failed, "FailureTarget").is_some());
    assert_eq!(failed.status.as_ref().and_then(|s| s.failed), Some(2));
    let table = c.kubectl(&["get", "job", "fail"]).await.ok().to_string();
    assert!(table.contains("Failed   0/1"), "{table}");
    let evs = events_for(&events, "fail").await;
    assert!(
        evs.contains(&(
            "BackoffLimitExceeded".into(),
            "Job has reached the specified backoff limit".into()
        )),
        "{evs:?}"
    );

    // A pod that succeeds and is force-deleted right away is counted all the same: the
    // finalizer holds it until the Job recorded it.
    create_job(&jobs, "quick", json!({})).await;
    let p = eventually("quick pod", || async {
        live_pods(&pods, "quick").await.into_iter().next()
    })
    .await;
    let pname = p.metadata.name.clone().expect("name");
    finish_pod(&pods, &pname, "Succeeded", 0).await;
    pods.delete(
        &pname,
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .expect("delete pod");
    let done = wait_condition(&jobs, "quick", "Complete", 300).await;
    assert_eq!(done.status.and_then(|s| s.succeeded), Some(1));
    eventually("deleted pod gone once counted", || async {
        pods.get_opt(&pname).await.ok()?.is_none().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_failure_policy_suspend_deadline_and_ttl() {
    let c = common::start().await;
    let client = c.client().await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    create_job(&jobs, "pfp", json!({"podFailurePolicy": {"rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}}]}})).await;
    let p = eventually("pfp pod", || async {
        live_pods(&pods, "pfp").await.into_iter().next()
    })
    .await;
    let pname = p.metadata.name.clone().expect("name");
    finish_pod(&pods, &pname, "Failed", 42).await;
    let failed = wait_condition(&jobs, "pfp", "Failed", 300).await;
    let cond = condition(&failed, "Failed").expect("Failed");
    assert_eq!(cond.reason.as_deref(), Some("PodFailurePolicy"));
    assert_eq!(
        cond.message.as_deref(),
        Some(format!("Container main for pod default/{pname} failed with exit code 42 matching FailJob rule at index 0").as_str())
    );

    create_job(&jobs, "sus", json!({"suspend": true})).await;
    let j = wait_condition(&jobs, "sus", "Suspended", 300).await;
    let cond = condition(&j, "Suspended").expect("Suspended");
    assert_eq!(cond.reason.as_deref(), Some("JobSuspended"));
    assert!(live_pods(&pods, "sus").await.is_empty());
    let table = c.kubectl(&["get", "job", "sus"]).await.ok().to_string();
    assert!(table.contains("Suspended"), "{table}");
    jobs.patch(
        "sus",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"suspend": false}})),
    )
    .await
    .expect("resume");
    eventually("pod after resume", || async {
        live_pods(&pods, "sus").await.into_iter().next()
    })
    .await;
    jobs.patch(
        "sus",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"suspend": true}})),
    )
    .await
    .expect("suspend again");
    eventually("pods deleted on suspend", || async {
        live_pods(&pods, "sus").await.is_empty().then_some(())
    })
    .await;

    create_job(&jobs, "late", json!({"activeDeadlineSeconds": 1})).await;
    let failed = wait_condition(&jobs, "late", "Failed", 300).await;
    let cond = condition(&failed, "Failed").expect("Failed");
    assert_eq!(cond.reason.as_deref(), Some("DeadlineExceeded"));
    assert_eq!(
        cond.message.as_deref(),
        Some("Job was active longer than specified deadline")
    );

    create_job(&jobs, "ttl", json!({"ttlSecondsAfterFinished": 0})).await;
    let p = eventually("ttl pod", || async {
        live_pods(&pods, "ttl").await.into_iter().next()
    })
    .await;
    finish_pod(
        &pods,
        p.metadata.name.as_deref().expect("name"),
        "Succeeded",
        0,
    )
    .await;
    eventually("job deleted after its ttl", || async {
        jobs.get_opt("ttl").await.ok()?.is_none().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_texts_are_upstreams() {
    let c = common::start().await;
    let always = serde_json::to_string(&job_json("bad", json!({})))
        .expect("json")
        .replace("\"Never\"", "\"Always\"");
    let err = c
        .kubectl_stdin(&["create", "-f", "-"], Some(&always))
        .await
        .fails()
        .to_string();
    assert!(
        err.contains("spec.template.spec.restartPolicy: Unsupported value: \"Always\": supported values: \"OnFailure\", \"Never\""),
        "{err}"
    );
    let neg = serde_json::to_string(&job_json("neg", json!({"parallelism": -1}))).expect("json");
    let err = c
        .kubectl_stdin(&["create", "-f", "-"], Some(&neg))
        .await
        .fails()
        .to_string();
    assert!(
        err.contains("spec.parallelism: Invalid value: -1: must be greater than or equal to 0"),
        "{err}"
    );

    let err = c
        .kubectl(&[
            "create",
            "cronjob",
            "c",
            "--image=busybox",
            "--schedule=61 * * * *",
        ])
        .await
        .fails()
        .to_string();
    assert!(
        err.contains(
            "spec.schedule: Invalid value: \"61 * * * *\": end of range (61) above maximum (59): 61"
        ),
        "{err}"
    );
    let err = c
        .kubectl(&[
            "create",
            "cronjob",
            "c",
            "--image=busybox",
            "--schedule=TZ=UTC * * * * *",
        ])
        .await
        .fails()
        .to_string();
    assert!(
        err.contains("cannot use TZ or CRON_TZ in schedule, use timeZone field instead"),
        "{err}"
    );

    // successPolicy and the per-index limits: 422 with upstream's field errors.
    let cases = [
        (
            json!({"successPolicy": {"rules": [{"succeededCount": 1}]}}),
            "spec.successPolicy: Invalid value: batch.SuccessPolicy{Rules:[]batch.SuccessPolicyRule{batch.SuccessPolicyRule{SucceededIndexes:(*string)(nil), SucceededCount:(*int32)(1)}}}: requires indexed completion mode",
        ),
        (
            json!({"completionMode": "Indexed", "completions": 3,
                "successPolicy": {"rules": [{"succeededIndexes": "0-3"}]}}),
            "spec.successPolicy.rules[0].succeededIndexes: Invalid value: \"0-3\": error parsing succeededIndexes: too large index: \"3\"",
        ),
        (
            json!({"completionMode": "Indexed", "completions": 3,
                "successPolicy": {"rules": [{"succeededIndexes": "0,1", "succeededCount": 3}]}}),
            "spec.successPolicy.rules[0].succeededCount: Invalid value: 3: must be less than or equal to 2 (the number of indexes in the specified succeededIndexes field)",
        ),
        (
            json!({"completionMode": "Indexed", "completions": 3, "successPolicy": {"rules": []}}),
            "spec.successPolicy.rules: Required value: at least one rules must be specified when the successPolicy is specified",
        ),
        (
            json!({"backoffLimitPerIndex": 1}),
            "spec.backoffLimitPerIndex: Invalid value: 1: requires indexed completion mode",
        ),
        (
            json!({"completionMode": "Indexed", "completions": 3, "maxFailedIndexes": 1}),
            "spec.backoffLimitPerIndex: Required value: when maxFailedIndexes is specified",
        ),
        (
            json!({"completionMode": "Indexed", "completions": 3, "backoffLimitPerIndex": 1,
                "maxFailedIndexes": 4}),
            "spec.maxFailedIndexes: Invalid value: 4: must be less than or equal to completions",
        ),
    ];
    let jobs: Api<Job> = Api::namespaced(c.client().await, "default");
    for (spec, want) in cases {
        let body = serde_json::to_string(&job_json("bad", spec.clone())).expect("json");
        let err = c
            .kubectl_stdin(&["create", "-f", "-"], Some(&body))
            .await
            .fails()
            .to_string();
        assert!(
            err.contains("The Job \"bad\" is invalid") && err.contains(want),
            "{spec}: {err}"
        );
        let job: Job = serde_json::from_value(job_json("bad", spec.clone())).expect("job");
        match jobs.create(&PostParams::default(), &job).await {
            Err(kube::Error::Api(status)) => assert_eq!(status.code, 422, "{spec}"),
            other => panic!("{spec}: {other:?}"),
        }
    }

    c.kubectl(&["create", "job", "imm", "--image=busybox"])
        .await
        .ok();
    let err = c
        .kubectl(&["set", "image", "job/imm", "imm=nginx"])
        .await
        .fails()
        .to_string();
    assert!(
        err.contains("spec.template: Invalid value:") && err.contains("field is immutable"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cronjob_fires_and_create_job_from_cronjob() {
    let c = common::start().await;
    let client = c.client().await;
    let cjs: Api<CronJob> = Api::namespaced(client.clone(), "default");
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");

    c.kubectl(&[
        "create",
        "cronjob",
        "tick",
        "--image=busybox",
        "--schedule=* * * * *",
        "--",
        "true",
    ])
    .await
    .ok();
    let cj: Value =
        serde_json::from_str(c.kubectl(&["get", "cj", "tick", "-o", "json"]).await.ok())
            .expect("json");
    assert_eq!(cj["spec"]["concurrencyPolicy"], json!("Allow"));
    assert_eq!(cj["spec"]["suspend"], json!(false));
    assert_eq!(cj["spec"]["successfulJobsHistoryLimit"], json!(3));
    assert_eq!(cj["spec"]["failedJobsHistoryLimit"], json!(1));
    let table = c.kubectl(&["get", "cronjobs"]).await.ok().to_string();
    assert!(
        table.starts_with("NAME   SCHEDULE    TIMEZONE   SUSPEND   ACTIVE   LAST SCHEDULE   AGE"),
        "{table}"
    );

    // The next minute boundary is at most 60 s away.
    let job = eventually_n("the cronjob's first job", 750, || async {
        jobs.list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|j| {
                j.metadata
                    .owner_references
                    .clone()
                    .unwrap_or_default()
                    .iter()
                    .any(|o| o.kind == "CronJob" && o.name == "tick")
            })
    })
    .await;
    let name = job.metadata.name.clone().expect("name");
    let stamp = job.metadata.annotations.clone().unwrap_or_default()["batch.kubernetes.io/cronjob-scheduled-timestamp"].clone();
    let scheduled: k8s_openapi::jiff::Timestamp = stamp.parse().expect("rfc3339 annotation");
    assert_eq!(scheduled.as_second() % 60, 0, "{stamp}");
    assert_eq!(name, format!("tick-{}", scheduled.as_second() / 60));
    let cj = eventually("status.active", || async {
        let cj = cjs.get("tick").await.ok()?;
        let st = cj.status.clone()?;
        (st.active
            .unwrap_or_default()
            .iter()
            .any(|r| r.name.as_deref() == Some(name.as_str()))
            && st.last_schedule_time.is_some())
        .then_some(cj)
    })
    .await;
    assert_eq!(
        cj.status.and_then(|s| s.last_schedule_time).map(|t| t.0),
        Some(scheduled)
    );

    c.kubectl(&["create", "job", "manual", "--from=cronjob/tick"])
        .await
        .ok();
    let manual = jobs.get("manual").await.expect("manual job");
    assert_eq!(
        manual
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .get("cronjob.kubernetes.io/instantiate")
            .map(String::as_str),
        Some("manual")
    );
    assert!(
        manual
            .metadata
            .owner_references
            .unwrap_or_default()
            .iter()
            .any(|o| o.kind == "CronJob" && o.name == "tick")
    );

    // Suspending stops further runs; the table says so.
    cjs.patch(
        "tick",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"suspend": true}})),
    )
    .await
    .expect("suspend");
    let table = c.kubectl(&["get", "cj", "tick"]).await.ok().to_string();
    assert!(table.contains("True"), "{table}");
}
