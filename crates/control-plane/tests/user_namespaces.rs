//! Pods with `hostUsers: false` through the API server: the host namespaces upstream
//! forbids with a user namespace are a 422 with upstream's texts, for kubectl and for a
//! typed client alike; the user namespace alone is accepted.

mod common;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};

fn pod_yaml(name: &str, extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  hostUsers: false\n{extra}  containers: [{{name: c, image: busybox}}]\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_is_told_which_host_namespace_a_user_namespace_forbids() {
    let c = common::start().await;

    let out = c
        .kubectl_stdin(
            &["create", "-f", "-"],
            Some(&pod_yaml("hostnet", "  hostNetwork: true\n")),
        )
        .await;
    assert_eq!(
        out.fails().trim(),
        "The Pod \"hostnet\" is invalid: spec.hostNetwork: Forbidden: when `pod.Spec.HostUsers` is false"
    );

    let out = c
        .kubectl_stdin(
            &["create", "-f", "-"],
            Some(&pod_yaml(
                "allhost",
                "  hostNetwork: true\n  hostPID: true\n  hostIPC: true\n",
            )),
        )
        .await;
    assert_eq!(
        out.fails().trim(),
        "The Pod \"allhost\" is invalid: \n\
         * spec.hostNetwork: Forbidden: when `pod.Spec.HostUsers` is false\n\
         * spec.HostPID: Forbidden: when `pod.Spec.HostUsers` is false\n\
         * spec.HostIPC: Forbidden: when `pod.Spec.HostUsers` is false"
    );

    let ok = c
        .kubectl_stdin(&["create", "-f", "-"], Some(&pod_yaml("isolated", "")))
        .await;
    assert_eq!(ok.ok().trim(), "pod/isolated created");
    let got = c
        .kubectl(&["get", "pod", "isolated", "-o", "jsonpath={.spec.hostUsers}"])
        .await;
    assert_eq!(got.ok(), "false", "the field is stored as given");
    let none = c.kubectl(&["get", "pods", "hostnet", "allhost"]).await;
    assert!(
        none.fails().contains("pods \"hostnet\" not found"),
        "refused pods are not stored: {}",
        none.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_answers_422_invalid() {
    let c = common::start().await;
    let pods: Api<Pod> = Api::namespaced(c.client().await, "default");
    let pod: Pod = serde_yaml::from_str(&pod_yaml("hostpid", "  hostPID: true\n")).expect("pod");
    let err = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect_err("refused");
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 422);
            assert_eq!(s.reason, "Invalid");
            assert_eq!(
                s.message,
                "Pod \"hostpid\" is invalid: spec.HostPID: Forbidden: when `pod.Spec.HostUsers` is false"
            );
        }
        other => panic!("expected an API error, got {other:?}"),
    }
}
