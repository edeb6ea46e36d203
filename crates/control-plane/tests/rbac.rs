//! RBAC as users meet it with the real kubectl: the bootstrap policy, bindings granting
//! roles, upstream's 403 texts, aggregation, reviews (`auth can-i`, `--list`, `whoami`),
//! impersonation, the Node authorizer, and reconciliation across restarts.

mod common;

use std::path::{Path, PathBuf};

use common::{Out, kubectl_with};
use nodus_control_plane::apiserver::state::ApiConfig;

const BOB_TOKEN: &str = "bob-token-0123456789";

/// A control plane whose token file has `bob` (no groups).
async fn cluster() -> common::Cluster {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("tokens.csv"),
        format!("{BOB_TOKEN},bob,1001\n"),
    )
    .expect("tokens");
    let handle = common::start_in(dir.path(), ApiConfig::default()).await;
    common::Cluster { handle, dir }
}

/// A kubeconfig for the static-token user bob.
fn bob_kubeconfig(c: &common::Cluster) -> PathBuf {
    let admin = std::fs::read_to_string(c.kubeconfig()).expect("admin kubeconfig");
    let ca = c.dir.path().join("pki/ca.crt");
    let path = c.dir.path().join("bob.kubeconfig");
    let server = admin
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .expect("server line")
        .to_string();
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: bob\n  user:\n    token: {BOB_TOKEN}\ncontexts:\n- name: bob\n  context:\n    cluster: c\n    user: bob\n    namespace: default\ncurrent-context: bob\n",
            ca.display()
        ),
    )
    .expect("bob kubeconfig");
    path
}

async fn as_user(kc: &Path, args: &[&str]) -> Out {
    kubectl_with(kc, args, None).await
}

/// `kubectl auth can-i <args>` in default, as the kube-system service account `sa`.
async fn can_i(c: &common::Cluster, sa: &str, args: &[&str]) -> String {
    let who = format!("--as=system:serviceaccount:kube-system:{sa}");
    let mut all = vec!["auth", "can-i", "-n", "default", who.as_str()];
    all.extend_from_slice(args);
    let out = c.kubectl(&all).await;
    assert_eq!(out.stderr, "", "can-i {args:?} as {sa}");
    out.stdout.trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bindings_grant_roles_and_refusals_read_as_upstream() {
    let c = cluster().await;
    let bob = bob_kubeconfig(&c);

    let out = as_user(&bob, &["get", "secrets"]).await;
    assert!(
        out.fails().contains(
            r#"Error from server (Forbidden): secrets is forbidden: User "bob" cannot list resource "secrets" in API group "" in the namespace "default""#
        ),
        "{}",
        out.stderr
    );
    let out = as_user(&bob, &["get", "nodes"]).await;
    assert!(
        out.fails().contains(
            r#"nodes is forbidden: User "bob" cannot list resource "nodes" in API group "" at the cluster scope"#
        ),
        "{}",
        out.stderr
    );
    let out = as_user(
        &bob,
        &["get", "--raw", "/api/v1/namespaces/default/pods/x/log"],
    )
    .await;
    assert!(
        out.fails().contains(
            r#"pods "x" is forbidden: User "bob" cannot get resource "pods/log" in API group "" in the namespace "default""#
        ),
        "{}",
        out.stderr
    );
    let out = as_user(&bob, &["get", "--raw", "/metrics"]).await;
    assert!(
        out.fails()
            .contains(r#"forbidden: User "bob" cannot get path "/metrics""#),
        "{}",
        out.stderr
    );
    // Discovery and the public paths are open to every authenticated user.
    as_user(&bob, &["get", "--raw", "/version"]).await.ok();
    as_user(&bob, &["get", "--raw", "/apis"]).await.ok();

    c.kubectl(&[
        "create",
        "rolebinding",
        "bob-view",
        "--clusterrole=view",
        "--user=bob",
    ])
    .await
    .ok();
    as_user(&bob, &["get", "pods"]).await;
    let pods = as_user(&bob, &["get", "pods"]).await;
    assert_eq!(pods.code, 0, "view reads pods: {}", pods.stderr);
    assert!(
        as_user(&bob, &["get", "secrets"])
            .await
            .fails()
            .contains("forbidden"),
        "view cannot read secrets"
    );
    assert!(
        as_user(&bob, &["get", "pods", "-n", "kube-system"])
            .await
            .fails()
            .contains(r#"in the namespace "kube-system""#),
        "a RoleBinding grants in its namespace only"
    );
    c.kubectl(&[
        "create",
        "rolebinding",
        "bob-edit",
        "--clusterrole=edit",
        "--user=bob",
    ])
    .await
    .ok();
    let secrets = as_user(&bob, &["get", "secrets"]).await;
    assert_eq!(secrets.code, 0, "edit reads secrets: {}", secrets.stderr);
    as_user(&bob, &["create", "configmap", "made-by-bob"])
        .await
        .ok();

    // A Role of the namespace, bound to bob's identity, with resourceNames.
    c.kubectl(&[
        "create",
        "role",
        "one-node-reader",
        "--verb=get",
        "--resource=nodes",
        "-n",
        "default",
    ])
    .await
    .ok();
    let out = c
        .kubectl(&[
            "create",
            "clusterrole",
            "named-cm",
            "--verb=get",
            "--resource=configmaps",
            "--resource-name=allowed",
        ])
        .await;
    out.ok();
    c.kubectl(&[
        "create",
        "clusterrolebinding",
        "bob-named",
        "--clusterrole=named-cm",
        "--user=bob",
    ])
    .await
    .ok();
    let out = c
        .kubectl(&[
            "auth",
            "can-i",
            "get",
            "configmaps/allowed",
            "-n",
            "kube-system",
            "--as=bob",
        ])
        .await;
    assert_eq!(out.stdout.trim(), "yes", "{}", out.stderr);
    let out = c
        .kubectl(&[
            "auth",
            "can-i",
            "get",
            "configmaps/other",
            "-n",
            "kube-system",
            "--as=bob",
        ])
        .await;
    assert_eq!(out.stdout.trim(), "no", "{}", out.stderr);

    // Printers: the binding's role and subjects, as `-o wide` shows them.
    let wide = c
        .kubectl(&[
            "get",
            "clusterrolebinding",
            "bob-named",
            "cluster-admin",
            "-o",
            "wide",
        ])
        .await;
    let text = wide.ok();
    let header: Vec<&str> = text
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["NAME", "ROLE", "AGE", "USERS", "GROUPS", "SERVICEACCOUNTS"],
        "{text}"
    );
    assert!(text.contains("ClusterRole/named-cm"), "{text}");
    assert!(text.contains("system:masters"), "{text}");
    let roles = c.kubectl(&["get", "roles"]).await;
    assert!(roles.ok().starts_with("NAME"), "{}", roles.stdout);
    assert!(roles.stdout.contains("CREATED AT"), "{}", roles.stdout);
    let describe = c.kubectl(&["describe", "clusterrole", "named-cm"]).await;
    assert!(describe.ok().contains("[allowed]"), "{}", describe.stdout);

    // Validation: the role reference is immutable, kinds as upstream.
    let out = c
        .kubectl_stdin(
            &["apply", "-f", "-"],
            Some(
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: bob-view\n  namespace: default\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: edit\nsubjects:\n- kind: User\n  name: bob\n",
            ),
        )
        .await;
    assert!(
        out.fails().contains("cannot change roleRef"),
        "{}",
        out.stderr
    );
    let out = c
        .kubectl_stdin(
            &["create", "-f", "-"],
            Some(
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: bad\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: Role\n  name: x\nsubjects:\n- kind: Robot\n  name: r\n",
            ),
        )
        .await;
    let err = out.fails();
    assert!(
        err.contains(r#"roleRef.kind: Unsupported value: "Role": supported values: "ClusterRole""#),
        "{err}"
    );
    assert!(
        err.contains(r#"subjects[0].kind: Unsupported value: "Robot""#),
        "{err}"
    );
    c.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_accounts_reviews_impersonation_and_aggregation() {
    let c = cluster().await;
    let bob = bob_kubeconfig(&c);

    // A service account's certificate: discovery only.
    let probe = nodus_control_plane::pki::issue_user_kubeconfig(
        c.dir.path(),
        "probe.kubeconfig",
        "system:serviceaccount:default:probe",
        &["system:serviceaccounts", "system:serviceaccounts:default"],
        &c.handle.url,
    )
    .expect("probe kubeconfig");
    as_user(&probe, &["api-resources"]).await.ok();
    let out = as_user(&probe, &["get", "pods", "-n", "default"]).await;
    assert!(
        out.fails().contains(
            r#"User "system:serviceaccount:default:probe" cannot list resource "pods" in API group "" in the namespace "default""#
        ),
        "{}",
        out.stderr
    );
    // Bound as a ServiceAccount subject, it may.
    c.kubectl(&[
        "create",
        "rolebinding",
        "probe-view",
        "--clusterrole=view",
        "--serviceaccount=default:probe",
    ])
    .await
    .ok();
    let out = as_user(&probe, &["get", "pods", "-n", "default"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);

    // whoami and can-i --list for a plain user: exactly the bootstrap policy's grants.
    let who = as_user(&bob, &["auth", "whoami"]).await;
    let who = who.ok();
    assert!(who.contains("Username") && who.contains("bob"), "{who}");
    assert!(who.contains("system:authenticated"), "{who}");
    let list = as_user(&bob, &["auth", "can-i", "--list"]).await;
    let list = list.ok();
    for want in [
        "selfsubjectreviews.authentication.k8s.io",
        "selfsubjectaccessreviews.authorization.k8s.io",
        "selfsubjectrulesreviews.authorization.k8s.io",
        "[/api/*]",
        "[/healthz]",
        "[/version]",
    ] {
        assert!(list.contains(want), "missing {want} in\n{list}");
    }
    assert!(!list.contains("pods"), "{list}");
    let out = as_user(&bob, &["auth", "can-i", "list", "pods"]).await;
    assert_eq!(out.stdout.trim(), "no");

    // Impersonation: the admin may, bob may not.
    let out = c
        .kubectl(&["auth", "can-i", "list", "pods", "--as=bob"])
        .await;
    assert_eq!(out.stdout.trim(), "no", "{}", out.stderr);
    let out = c.kubectl(&["auth", "can-i", "list", "pods"]).await;
    assert_eq!(out.stdout.trim(), "yes", "{}", out.stderr);
    let out = as_user(&bob, &["get", "pods", "--as=alice"]).await;
    assert!(
        out.fails().contains(
            r#"users "alice" is forbidden: User "bob" cannot impersonate resource "users" in API group "" at the cluster scope"#
        ),
        "{}",
        out.stderr
    );
    c.kubectl(&[
        "create",
        "clusterrole",
        "impersonate-alice",
        "--verb=impersonate",
        "--resource=users",
        "--resource-name=alice",
    ])
    .await
    .ok();
    c.kubectl(&[
        "create",
        "clusterrolebinding",
        "bob-as-alice",
        "--clusterrole=impersonate-alice",
        "--user=bob",
    ])
    .await
    .ok();
    let who = as_user(&bob, &["auth", "whoami", "--as=alice"]).await;
    assert!(who.ok().contains("alice"), "{}", who.stdout);

    // Aggregation: a ClusterRole labelled aggregate-to-view lands in view (and edit, admin).
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: widgets-view\n  labels:\n    rbac.authorization.k8s.io/aggregate-to-view: \"true\"\nrules:\n- apiGroups: [\"example.com\"]\n  resources: [\"widgets\"]\n  verbs: [\"get\", \"list\"]\n",
        ),
    )
    .await
    .ok();
    for role in ["view", "edit", "admin"] {
        common::eventually(&format!("widgets in {role}"), || async {
            let out = c
                .kubectl(&[
                    "get",
                    "clusterrole",
                    role,
                    "-o",
                    "jsonpath={.rules[*].resources}",
                ])
                .await;
            out.stdout.contains("widgets").then_some(())
        })
        .await;
    }
    c.handle.shutdown().await;
}

/// The controllers' roles of upstream's bootstrap policy, as `kubectl get -o yaml` on a
/// kube-apiserver shows the deployment controller's.
const DEPLOYMENT_CONTROLLER_RULES: &str = r#"- apiGroups:
  - apps
  - extensions
  resources:
  - deployments
  verbs:
  - get
  - list
  - update
  - watch
- apiGroups:
  - apps
  - extensions
  resources:
  - deployments/status
  verbs:
  - update
- apiGroups:
  - apps
  - extensions
  resources:
  - deployments/finalizers
  verbs:
  - update
- apiGroups:
  - apps
  - extensions
  resources:
  - replicasets
  verbs:
  - create
  - delete
  - get
  - list
  - patch
  - update
  - watch
- apiGroups:
  - ""
  resources:
  - pods
  verbs:
  - get
  - list
  - update
  - watch
- apiGroups:
  - ""
  - events.k8s.io
  resources:
  - events
  verbs:
  - create
  - patch
  - update
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controllers_have_upstreams_roles_bound_to_their_service_accounts() {
    let c = cluster().await;

    let yaml = c
        .kubectl(&[
            "get",
            "clusterrole",
            "system:controller:deployment-controller",
            "-o",
            "yaml",
        ])
        .await;
    let yaml = yaml.ok();
    assert!(
        yaml.contains("    kubernetes.io/bootstrapping: rbac-defaults\n"),
        "{yaml}"
    );
    assert!(
        yaml.contains("    rbac.authorization.kubernetes.io/autoupdate: \"true\"\n"),
        "{yaml}"
    );
    let (_, rules) = yaml.split_once("\nrules:\n").expect("rules in the yaml");
    assert_eq!(rules, DEPLOYMENT_CONTROLLER_RULES);

    // Each role is bound, under its own name, to its controller's service account.
    let wide = c
        .kubectl(&[
            "get",
            "clusterrolebinding",
            "system:controller:deployment-controller",
            "system:controller:certificate-controller",
            "-o",
            "wide",
        ])
        .await;
    let wide = wide.ok();
    for want in [
        "ClusterRole/system:controller:deployment-controller",
        "kube-system/deployment-controller",
        "ClusterRole/system:controller:certificate-controller",
        "kube-system/certificate-controller",
    ] {
        assert!(wide.contains(want), "missing {want} in\n{wide}");
    }
    let mut args = vec!["get", "clusterrole", "-o", "name"];
    let names: Vec<String> = [
        "attachdetach-controller",
        "clusterrole-aggregation-controller",
        "cronjob-controller",
        "daemon-set-controller",
        "deployment-controller",
        "disruption-controller",
        "endpoint-controller",
        "endpointslice-controller",
        "endpointslicemirroring-controller",
        "expand-controller",
        "ephemeral-volume-controller",
        "generic-garbage-collector",
        "horizontal-pod-autoscaler",
        "job-controller",
        "namespace-controller",
        "node-controller",
        "persistent-volume-binder",
        "pod-garbage-collector",
        "replicaset-controller",
        "replication-controller",
        "resourcequota-controller",
        "route-controller",
        "service-account-controller",
        "service-controller",
        "statefulset-controller",
        "ttl-controller",
        "certificate-controller",
        "pvc-protection-controller",
        "pv-protection-controller",
        "ttl-after-finished-controller",
        "root-ca-cert-publisher",
        "validatingadmissionpolicy-status-controller",
        "legacy-service-account-token-cleaner",
    ]
    .iter()
    .map(|n| format!("system:controller:{n}"))
    .collect();
    args.extend(names.iter().map(String::as_str));
    let listed = c.kubectl(&args).await;
    let listed = listed.ok();
    assert_eq!(listed.lines().count(), names.len(), "{listed}");

    // What the role grants, asked as the controller's service account.
    let rs = "replicaset-controller";
    assert_eq!(can_i(&c, rs, &["create", "pods"]).await, "yes");
    assert_eq!(
        can_i(
            &c,
            rs,
            &["update", "replicasets.apps", "--subresource=status"]
        )
        .await,
        "yes"
    );
    assert_eq!(can_i(&c, rs, &["get", "secrets"]).await, "no");
    assert_eq!(can_i(&c, rs, &["create", "replicasets.apps"]).await, "no");
    let ns = "namespace-controller";
    assert_eq!(
        can_i(&c, ns, &["deletecollection", "configmaps"]).await,
        "yes"
    );
    assert_eq!(can_i(&c, ns, &["create", "configmaps"]).await, "no");
    assert_eq!(
        can_i(&c, "no-such-controller", &["create", "pods"]).await,
        "no",
        "only the bound service accounts may"
    );
    c.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escalation_is_refused_without_escalate_or_bind() {
    let c = cluster().await;
    let bob = bob_kubeconfig(&c);
    // bob administers roles in default but holds nothing else (`*` would include
    // escalate and bind).
    c.kubectl(&[
        "create",
        "role",
        "rbac-manager",
        "--verb=get,list,create,update,patch,delete",
        "--resource=roles.rbac.authorization.k8s.io,rolebindings.rbac.authorization.k8s.io",
    ])
    .await
    .ok();
    c.kubectl(&[
        "create",
        "rolebinding",
        "bob-rbac",
        "--role=rbac-manager",
        "--user=bob",
    ])
    .await
    .ok();
    let out = as_user(
        &bob,
        &[
            "create",
            "role",
            "secrets-reader",
            "--verb=get",
            "--resource=secrets",
        ],
    )
    .await;
    let err = out.fails();
    assert!(
        err.contains(r#"roles.rbac.authorization.k8s.io "secrets-reader" is forbidden: user "bob" (groups=["system:authenticated"]) is attempting to grant RBAC permissions not currently held:"#),
        "{err}"
    );
    assert!(
        err.contains("{APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\"]}"),
        "{err}"
    );
    let out = as_user(
        &bob,
        &[
            "create",
            "rolebinding",
            "bob-view",
            "--clusterrole=view",
            "--user=bob",
        ],
    )
    .await;
    assert!(
        out.fails()
            .contains("is attempting to grant RBAC permissions not currently held"),
        "{}",
        out.stderr
    );

    // With escalate, the role may be written; with bind, the binding.
    c.kubectl(&[
        "create",
        "clusterrole",
        "escalator",
        "--verb=escalate,bind",
        "--resource=roles.rbac.authorization.k8s.io,clusterroles.rbac.authorization.k8s.io",
    ])
    .await
    .ok();
    c.kubectl(&[
        "create",
        "rolebinding",
        "bob-escalate",
        "--clusterrole=escalator",
        "--user=bob",
    ])
    .await
    .ok();
    as_user(
        &bob,
        &[
            "create",
            "role",
            "secrets-reader",
            "--verb=get",
            "--resource=secrets",
        ],
    )
    .await
    .ok();
    as_user(
        &bob,
        &[
            "create",
            "rolebinding",
            "bob-view",
            "--clusterrole=view",
            "--user=bob",
        ],
    )
    .await
    .ok();
    let pods = as_user(&bob, &["get", "pods"]).await;
    assert_eq!(pods.code, 0, "{}", pods.stderr);
    c.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciliation_keeps_user_changes_and_restores_deleted_roles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = common::start_in(dir.path(), ApiConfig::default()).await;
    let kc = handle.kubeconfig.clone();
    let k = |args: &'static [&'static str]| {
        let kc = kc.clone();
        async move { kubectl_with(&kc, args, None).await }
    };
    k(&["patch", "clusterrolebinding", "system:discovery", "--type=json", "-p",
        r#"[{"op":"add","path":"/subjects/-","value":{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"carol"}}]"#])
        .await
        .ok();
    k(&["delete", "clusterrole", "system:node-proxier"])
        .await
        .ok();
    k(&[
        "delete",
        "clusterrole,clusterrolebinding",
        "system:controller:job-controller",
    ])
    .await
    .ok();
    let job_controller: &[&str] = &[
        "auth",
        "can-i",
        "create",
        "pods",
        "--as=system:serviceaccount:kube-system:job-controller",
    ];
    let out = kubectl_with(&kc, job_controller, None).await;
    assert_eq!(out.stdout.trim(), "no", "deleted: {}", out.stderr);
    handle.shutdown().await;

    let handle = common::start_in(dir.path(), ApiConfig::default()).await;
    let kc = handle.kubeconfig.clone();
    let subjects = kubectl_with(
        &kc,
        &[
            "get",
            "clusterrolebinding",
            "system:discovery",
            "-o",
            "jsonpath={.subjects[*].name}",
        ],
        None,
    )
    .await;
    let subjects = subjects.ok();
    assert!(
        subjects.contains("carol") && subjects.contains("system:authenticated"),
        "{subjects}"
    );
    let proxier = kubectl_with(
        &kc,
        &["get", "clusterrole", "system:node-proxier", "-o", "name"],
        None,
    )
    .await;
    assert_eq!(
        proxier.ok().trim(),
        "clusterrole.rbac.authorization.k8s.io/system:node-proxier"
    );
    let kp = kubectl_with(
        &kc,
        &[
            "auth",
            "can-i",
            "watch",
            "endpointslices.discovery.k8s.io",
            "--as=system:kube-proxy",
        ],
        None,
    )
    .await;
    assert_eq!(kp.stdout.trim(), "yes", "{}", kp.stderr);
    let restored = kubectl_with(
        &kc,
        &[
            "get",
            "clusterrole,clusterrolebinding",
            "system:controller:job-controller",
            "-o",
            "name",
        ],
        None,
    )
    .await;
    assert_eq!(
        restored.ok(),
        "clusterrole.rbac.authorization.k8s.io/system:controller:job-controller\n\
         clusterrolebinding.rbac.authorization.k8s.io/system:controller:job-controller\n"
    );
    let out = kubectl_with(&kc, job_controller, None).await;
    assert_eq!(out.stdout.trim(), "yes", "restored: {}", out.stderr);
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_are_restricted_to_their_own_objects() {
    let c = cluster().await;
    for n in ["n1", "n2"] {
        c.kubectl_stdin(
            &["create", "-f", "-"],
            Some(&format!(
                "apiVersion: v1\nkind: Node\nmetadata:\n  name: {n}\n"
            )),
        )
        .await
        .ok();
    }
    c.kubectl_stdin(
        &["create", "-f", "-"],
        Some("apiVersion: v1\nkind: Pod\nmetadata:\n  name: bound\n  namespace: default\nspec:\n  nodeName: n1\n  containers:\n  - name: c\n    image: busybox\n"),
    )
    .await
    .ok();
    let node = nodus_control_plane::pki::issue_node_kubeconfig(c.dir.path(), "n1", &c.handle.url)
        .expect("node kubeconfig");

    let mirror = |volume: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: m\n  namespace: default\n  annotations:\n    kubernetes.io/config.mirror: abc\nspec:\n  nodeName: n1\n  containers:\n  - name: c\n    image: busybox\n{volume}"
        )
    };
    let out = kubectl_with(
        &node,
        &["create", "-f", "-"],
        Some(&mirror(
            "  volumes:\n  - name: s\n    secret:\n      secretName: token\n",
        )),
    )
    .await;
    assert!(
        out.fails().contains(
            r#"pods "m" is forbidden: node "n1" can not create pods that reference secrets"#
        ),
        "{}",
        out.stderr
    );
    kubectl_with(&node, &["create", "-f", "-"], Some(&mirror("")))
        .await
        .ok();

    let out = as_user(&node, &["label", "pod", "bound", "-n", "default", "x=y"]).await;
    assert!(
        out.fails().contains(
            r#"pods "bound" is forbidden: unexpected operation "UPDATE", node "n1" can only create and delete mirror pods"#
        ),
        "{}",
        out.stderr
    );
    let out = as_user(&node, &["label", "node", "n2", "x=y"]).await;
    assert!(
        out.fails().contains(
            r#"nodes "n2" is forbidden: User "system:node:n1" cannot patch resource "nodes""#
        ),
        "{}",
        out.stderr
    );
    let out = as_user(
        &node,
        &[
            "label",
            "node",
            "n1",
            "node-role.kubernetes.io/control-plane=",
        ],
    )
    .await;
    assert!(
        out.fails().contains(
            r#"nodes "n1" is forbidden: node "n1" is not allowed to modify labels: node-role.kubernetes.io/control-plane"#
        ),
        "{}",
        out.stderr
    );
    as_user(&node, &["label", "node", "n1", "team=blue"])
        .await
        .ok();
    // The kubelet's own API use still works: status of its pod, reviews, discovery.
    as_user(&node, &["get", "pods", "-A"]).await;
    let out = as_user(
        &node,
        &[
            "auth",
            "can-i",
            "create",
            "tokenreviews.authentication.k8s.io",
        ],
    )
    .await;
    assert_eq!(out.stdout.trim(), "yes", "{}", out.stderr);
    c.handle.shutdown().await;
}
