use super::*;
use k8s_openapi::api::core::v1::PodSpec;

fn pod(name: &str, priority: Option<i32>, grace: Option<i64>) -> Pod {
    Pod {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            priority,
            termination_grace_period_seconds: grace,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn g(priority: i32, secs: i64) -> PriorityGracePeriod {
    PriorityGracePeriod {
        priority,
        shutdown_grace_period_seconds: secs,
    }
}

fn names(groups: &[Vec<Pod>]) -> Vec<Vec<String>> {
    groups
        .iter()
        .map(|ps| {
            ps.iter()
                .map(|p| p.metadata.name.clone().unwrap())
                .collect()
        })
        .collect()
}

#[test]
fn two_field_form_becomes_ordinary_then_critical() {
    let c = Config {
        shutdown_grace_period: Duration::from_secs(30),
        shutdown_grace_period_critical_pods: Duration::from_secs(10),
        ..Default::default()
    };
    assert_eq!(c.groups(), vec![g(0, 20), g(SYSTEM_CRITICAL_PRIORITY, 10)]);
    assert_eq!(period_requested(&c.groups()), Duration::from_secs(30));
    // Off when no period is set.
    assert!(Config::default().groups().is_empty());
}

#[test]
fn by_priority_groups_are_sorted_low_to_high() {
    let c = Config {
        by_pod_priority: vec![g(100_000, 10), g(0, 5), g(1000, 7)],
        ..Default::default()
    };
    assert_eq!(c.groups(), vec![g(0, 5), g(1000, 7), g(100_000, 10)]);
}

#[test]
fn pods_fall_in_the_highest_group_they_reach() {
    // upstream's groupByPriority table: below the lowest → lowest, above the highest →
    // highest, on a boundary → that group, between two → the lower one.
    let groups = [g(1, 10), g(1000, 20), g(100_000, 30)];
    let pods = vec![
        pod("none", None, None),
        pod("neg", Some(-5), None),
        pod("one", Some(1), None),
        pod("mid", Some(999), None),
        pod("thousand", Some(1000), None),
        pod("big", Some(5000), None),
        pod("top", Some(2_000_000_000), None),
    ];
    assert_eq!(
        names(&group_by_priority(&groups, pods)),
        vec![
            vec!["none", "neg", "one", "mid"],
            vec!["thousand", "big"],
            vec!["top"]
        ]
    );
}

#[test]
fn a_pods_grace_is_its_own_when_shorter_than_the_groups() {
    let group = g(0, 20);
    assert_eq!(pod_grace(&pod("a", None, Some(5)), &group), 5);
    assert_eq!(pod_grace(&pod("b", None, Some(60)), &group), 20);
    assert_eq!(pod_grace(&pod("c", None, None), &group), 20);
}

#[test]
fn validation_uses_upstreams_messages() {
    let bad = |c: Config| c.validate().unwrap_err();
    assert!(
        bad(Config {
            shutdown_grace_period: Duration::from_secs(10),
            shutdown_grace_period_critical_pods: Duration::from_secs(20),
            ..Default::default()
        })
        .contains("shutdownGracePeriodCriticalPods (20s) must be >= 0 and <= shutdownGracePeriod")
    );
    assert!(
        bad(Config {
            shutdown_grace_period: Duration::from_millis(500),
            ..Default::default()
        })
        .contains("shutdownGracePeriod (500ms) must be either zero or otherwise >= 1 sec")
    );
    assert!(
        bad(Config {
            shutdown_grace_period: Duration::from_secs(30),
            by_pod_priority: vec![g(0, 10)],
            ..Default::default()
        })
        .contains("Cannot specify both shutdownGracePeriodByPodPriority and shutdownGracePeriod")
    );
    assert!(
        Config {
            shutdown_grace_period: Duration::from_secs(30),
            shutdown_grace_period_critical_pods: Duration::from_secs(10),
            ..Default::default()
        }
        .validate()
        .is_ok()
    );
}

#[test]
fn admission_refuses_while_shutting_down() {
    let s = State::default();
    assert!(s.admit().is_ok());
    s.set(true);
    let r = s.admit().unwrap_err();
    assert_eq!(r.reason, "NodeShutdown");
    assert_eq!(r.message, "Pod was rejected as the node is shutting down.");
    s.set(false);
    assert!(s.admit().is_ok());
}

#[test]
fn a_shut_down_pod_ends_failed_terminated_with_a_disruption_target() {
    use crate::kubelet::{AbnormalReason, set_terminated_abnormally};
    let mut status = k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Running".into()),
        ..Default::default()
    };
    set_terminated_abnormally(&mut status, AbnormalReason::NodeShutdown, MESSAGE);
    assert_eq!(status.phase.as_deref(), Some("Failed"));
    assert_eq!(status.reason.as_deref(), Some("Terminated"));
    assert_eq!(
        status.message.as_deref(),
        Some("Pod was terminated in response to imminent node shutdown.")
    );
    let c = &status.conditions.unwrap()[0];
    assert_eq!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_deref()),
        ("DisruptionTarget", "True", Some("TerminationByKubelet"))
    );
    // A pod that already succeeded keeps its phase (upstream's shutdown kill).
    let mut done = k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Succeeded".into()),
        ..Default::default()
    };
    set_terminated_abnormally(&mut done, AbnormalReason::NodeShutdown, MESSAGE);
    assert_eq!(done.phase.as_deref(), Some("Succeeded"));
}

#[test]
fn the_kubelet_configuration_carries_the_three_fields() {
    let c: crate::kubeletconfig::KubeletConfiguration = serde_yaml::from_str(
        "shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\nshutdownGracePeriodByPodPriority:\n- priority: 1000\n  shutdownGracePeriodSeconds: 5\n",
    )
    .unwrap();
    assert_eq!(c.shutdown_grace_period.as_deref(), Some("30s"));
    assert_eq!(
        c.shutdown_grace_period_critical_pods.as_deref(),
        Some("10s")
    );
    assert_eq!(
        c.shutdown_grace_period_by_pod_priority.unwrap(),
        vec![g(1000, 5)]
    );
}
