//! batch/v1 end to end: a control plane and one real `nodus node` (runc, CNI) in a private
//! network namespace, driven by the real kubectl. `kubectl create job` runs to Complete; a
//! parallel Job (completions 4, parallelism 2) and an Indexed Job whose pods print their
//! `$JOB_COMPLETION_INDEX` complete; a failing Job ends Failed with BackoffLimitExceeded
//! after the back-off; an Indexed Job with a successPolicy completes when its leader index
//! does and its still-running workers are stopped; an Indexed Job with backoffLimitPerIndex
//! retries only its failing index, then fails with FailedIndexes; a CronJob `* * * * *`
//! fires within the minute; and `kubectl create job --from=cronjob/…` runs its template.

mod common;

use common::cluster::{self, ControlPlane, NodeProcess};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

const T: Duration = Duration::from_secs(120);

fn has_condition(j: &Value, ty: &str) -> bool {
    cluster::condition(j, ty).is_some_and(|c| c["status"] == "True")
}

fn finished(j: &Value) -> bool {
    has_condition(j, "Complete") || has_condition(j, "Failed")
}

fn job_yaml(name: &str, extra_spec: &str, command: &str) -> String {
    format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n{extra_spec}  template:\n    spec:\n      restartPolicy: Never\n      terminationGracePeriodSeconds: 1\n      containers:\n      - name: main\n        image: docker.io/library/busybox:latest\n        imagePullPolicy: IfNotPresent\n        command: [\"sh\", \"-c\", {command:?}]\n"
    )
}

#[test]
fn jobs_and_cronjobs_run_on_a_real_node() {
    if !common::have_root() {
        return;
    }
    let netns = Arc::new(testkit::Netns::new("nodus-batch").expect("netns"));
    let cgroup = testkit::CgroupParent::new("nodus-batch");
    cgroup.create();
    cluster::add_node_address(&netns);
    let cp = ControlPlane::start(netns.clone());
    let node = NodeProcess::start(&netns, &cp, "node-a", "10.99.66.0/24", &cgroup.path());
    let logs = || node.log();
    cp.wait_json(&["node", "node-a"], T, "node-a Ready", &logs, |n| {
        has_condition(n, "Ready")
    });

    // kubectl create job, to Complete, with the pod's output in kubectl logs.
    let (ok, out, err) = cp.kubectl(&[
        "create",
        "job",
        "hello",
        "--image=busybox:stable",
        "--",
        "echo",
        "hello from a job",
    ]);
    assert!(ok, "{out}{err}");
    let j = cp.wait_json(&["job", "hello"], T, "hello Complete", &logs, finished);
    assert!(has_condition(&j, "Complete"), "{j}");
    assert_eq!(j["status"]["succeeded"], 1, "{j}");
    let (ok, out, err) = cp.kubectl(&["logs", "job/hello"]);
    assert!(ok && out.contains("hello from a job"), "{out}{err}");
    let (_, table, _) = cp.kubectl(&["get", "job", "hello"]);
    assert!(table.contains("Complete   1/1"), "{table}");

    // A parallel Job: four completions, two at a time.
    cp.apply(&job_yaml(
        "par",
        "  completions: 4\n  parallelism: 2\n",
        "sleep 1",
    ));
    // An Indexed Job whose pods print their index.
    cp.apply(&job_yaml(
        "idx",
        "  completions: 3\n  parallelism: 3\n  completionMode: Indexed\n",
        "echo index=$JOB_COMPLETION_INDEX",
    ));
    // A failing Job: two failures (the second after a 10 s back-off) exceed backoffLimit 1.
    cp.apply(&job_yaml("boom", "  backoffLimit: 1\n", "exit 3"));
    // A leader and two workers that would run for minutes: done when the leader is.
    cp.apply(&job_yaml(
        "leader",
        "  completions: 3\n  parallelism: 3\n  completionMode: Indexed\n  successPolicy:\n    rules:\n    - succeededIndexes: \"0\"\n",
        "if [ \"$JOB_COMPLETION_INDEX\" = 0 ]; then exit 0; fi; sleep 600",
    ));
    // Index 1 always fails: retried once (after its own 10 s back-off), then given up.
    cp.apply(&job_yaml(
        "perix",
        "  completions: 3\n  parallelism: 3\n  completionMode: Indexed\n  backoffLimitPerIndex: 1\n",
        "[ \"$JOB_COMPLETION_INDEX\" != 1 ]",
    ));

    let par = cp.wait_json(&["job", "par"], T, "par Complete", &logs, finished);
    assert!(has_condition(&par, "Complete"), "{par}");
    assert_eq!(par["status"]["succeeded"], 4, "{par}");
    let creates = cluster::events_for(&cp, "default", "par")
        .into_iter()
        .filter(|(r, _)| r == "SuccessfulCreate")
        .count();
    assert_eq!(creates, 4);

    let idx = cp.wait_json(&["job", "idx"], T, "idx Complete", &logs, finished);
    assert!(has_condition(&idx, "Complete"), "{idx}");
    assert_eq!(idx["status"]["completedIndexes"], "0-2", "{idx}");
    let pods = cp
        .get_json(&["pods", "-l", "batch.kubernetes.io/job-name=idx"])
        .expect("idx pods");
    let items = pods["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(items.len(), 3, "{pods}");
    for p in items {
        let name = p["metadata"]["name"].as_str().unwrap_or("").to_string();
        let ix = p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
            .as_str()
            .unwrap_or("?")
            .to_string();
        let (ok, out, err) = cp.kubectl(&["logs", &name]);
        assert!(
            ok && out.trim() == format!("index={ix}"),
            "{name}: {out}{err}"
        );
    }

    let boom = cp.wait_json(&["job", "boom"], T, "boom Failed", &logs, finished);
    let failed = cluster::condition(&boom, "Failed").expect("Failed condition");
    assert_eq!(failed["reason"], "BackoffLimitExceeded", "{boom}");
    assert_eq!(
        failed["message"],
        "Job has reached the specified backoff limit"
    );
    assert_eq!(boom["status"]["failed"], 2, "{boom}");
    let (_, table, _) = cp.kubectl(&["get", "job", "boom"]);
    assert!(table.contains("Failed   0/1"), "{table}");

    let leader = cp.wait_json(&["job", "leader"], T, "leader Complete", &logs, finished);
    for ty in ["SuccessCriteriaMet", "Complete"] {
        let cond = cluster::condition(&leader, ty).unwrap_or_else(|| panic!("{ty}: {leader}"));
        assert_eq!(cond["status"], "True", "{leader}");
        assert_eq!(cond["reason"], "SuccessPolicy", "{leader}");
        assert_eq!(cond["message"], "Matched rules at index 0", "{leader}");
    }
    assert_eq!(leader["status"]["completedIndexes"], "0", "{leader}");
    assert_eq!(leader["status"]["succeeded"], 1, "{leader}");
    // The sleeping workers were stopped and removed; the leader's pod stays.
    let left = cp.wait_json(
        &["pods", "-l", "batch.kubernetes.io/job-name=leader"],
        T,
        "leader's workers removed",
        &logs,
        |l| l["items"].as_array().is_some_and(|i| i.len() == 1),
    );
    let only = &left["items"][0];
    assert_eq!(
        only["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"], "0",
        "{left}"
    );
    assert_eq!(only["status"]["phase"], "Succeeded", "{left}");

    let perix = cp.wait_json(&["job", "perix"], T, "perix Failed", &logs, finished);
    let failed = cluster::condition(&perix, "Failed").expect("Failed condition");
    assert_eq!(failed["reason"], "FailedIndexes", "{perix}");
    assert_eq!(failed["message"], "Job has failed indexes", "{perix}");
    assert_eq!(perix["status"]["failedIndexes"], "1", "{perix}");
    assert_eq!(perix["status"]["completedIndexes"], "0,2", "{perix}");
    assert_eq!(perix["status"]["failed"], 2, "{perix}");
    let pods = cp
        .get_json(&[
            "pods",
            "-l",
            "batch.kubernetes.io/job-name=perix,batch.kubernetes.io/job-completion-index=1",
        ])
        .expect("perix pods");
    let mut counts: Vec<String> = pods["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|p| {
            assert_eq!(p["status"]["phase"], "Failed", "{p}");
            p["metadata"]["annotations"]["batch.kubernetes.io/job-index-failure-count"]
                .as_str()
                .unwrap_or("?")
                .to_string()
        })
        .collect();
    counts.sort();
    assert_eq!(counts, ["0", "1"], "{pods}");

    // A CronJob firing every minute: its first Job comes at the next minute boundary.
    let (ok, out, err) = cp.kubectl(&[
        "create",
        "cronjob",
        "tick",
        "--image=busybox:stable",
        "--schedule=* * * * *",
        "--",
        "echo",
        "tick",
    ]);
    assert!(ok, "{out}{err}");
    let jobs = cp.wait_json(
        &["jobs"],
        Duration::from_secs(100),
        "a Job of the cronjob",
        &logs,
        |l| {
            l["items"].as_array().is_some_and(|items| {
                items
                    .iter()
                    .any(|j| j["metadata"]["ownerReferences"][0]["name"] == "tick" && finished(j))
            })
        },
    );
    let first = jobs["items"]
        .as_array()
        .and_then(|items| {
            items
                .iter()
                .find(|j| j["metadata"]["ownerReferences"][0]["name"] == "tick")
        })
        .cloned()
        .expect("cronjob's job");
    assert!(has_condition(&first, "Complete"), "{first}");
    let name = first["metadata"]["name"].as_str().unwrap_or("");
    let stamp = first["metadata"]["annotations"]["batch.kubernetes.io/cronjob-scheduled-timestamp"]
        .as_str()
        .unwrap_or("");
    let secs = stamp
        .parse::<k8s_openapi::jiff::Timestamp>()
        .map(|t| t.as_second())
        .unwrap_or_else(|e| panic!("annotation {stamp:?}: {e}"));
    assert_eq!(name, format!("tick-{}", secs / 60), "{first}");
    cp.wait_json(
        &["cronjob", "tick"],
        T,
        "tick lastSuccessfulTime",
        &logs,
        |c| {
            c["status"]["lastScheduleTime"].is_string()
                && c["status"]["lastSuccessfulTime"].is_string()
        },
    );

    // kubectl create job --from=cronjob/tick runs the template now.
    let (ok, out, err) = cp.kubectl(&["create", "job", "manual", "--from=cronjob/tick"]);
    assert!(ok, "{out}{err}");
    let manual = cp.wait_json(&["job", "manual"], T, "manual Complete", &logs, finished);
    assert!(has_condition(&manual, "Complete"), "{manual}");
    assert_eq!(
        manual["metadata"]["annotations"]["cronjob.kubernetes.io/instantiate"],
        "manual"
    );
    // kubectl picks the Job's pod itself; the finished container and its log stay with the
    // pod until it is deleted.
    let (ok, out, err) = cp.kubectl(&["logs", "job/manual"]);
    assert!(ok && out.contains("tick"), "{out}{err}\n{}", logs());

    drop(node);
    drop(cp);
    drop(cgroup);
}
