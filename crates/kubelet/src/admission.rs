//! Pod admission (upstream's `lifecycle.PodAdmitHandler`): a chain of handlers, each owned by
//! the manager whose check it is, run in order on every new pod; the first refusal fails the
//! pod with its reason and message and it never runs.
//!
//! The chain is built in [`crate::cli`]: node shutdown ([`crate::nodeshutdown`]), eviction
//! ([`crate::eviction::admission`]), node resources ([`crate::cm::admission`], upstream's
//! predicate handler), the topology manager ([`crate::cm::topologymanager`], which has the
//! CPU and memory managers ([`crate::cm::memorymanager`]) allocate on its merged hint), then
//! the device manager's allocation ([`crate::cm::devicemanager`]) last, so devices are only
//! allocated to a pod every other handler accepted.

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use std::sync::Arc;

/// Why a pod was refused: the pod's status `reason` (upstream's constants).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// `OutOf<resource>`: the pod does not fit in what is left of Allocatable.
    OutOf(String),
    /// The eviction manager's refusal under node pressure.
    Evicted,
    /// The shutdown manager's refusal while the node is going down.
    NodeShutdown,
    /// A manager failed to give the pod what it asked for (a device allocation).
    UnexpectedAdmissionError,
    /// The topology manager's policy found no NUMA placement for the pod.
    TopologyAffinityError,
    /// The CPU manager's `full-pcpus-only` refusal.
    SmtAlignmentError,
}

impl Reason {
    pub fn as_string(&self) -> String {
        match self {
            Reason::OutOf(r) => format!("OutOf{r}"),
            Reason::Evicted => crate::eviction::REASON.into(),
            Reason::NodeShutdown => crate::nodeshutdown::NOT_ADMITTED_REASON.into(),
            Reason::UnexpectedAdmissionError => "UnexpectedAdmissionError".into(),
            Reason::TopologyAffinityError => "TopologyAffinityError".into(),
            Reason::SmtAlignmentError => "SMTAlignmentError".into(),
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.as_string())
    }
}

impl PartialEq<&str> for Reason {
    fn eq(&self, other: &&str) -> bool {
        self.as_string() == *other
    }
}

/// A refusal: the pod's status gets phase Failed with these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub reason: Reason,
    pub message: String,
}

/// upstream's PodAdmitResult.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodAdmitResult {
    pub admit: bool,
    pub reason: Option<Reason>,
    pub message: String,
}

impl PodAdmitResult {
    pub fn admitted() -> PodAdmitResult {
        PodAdmitResult {
            admit: true,
            reason: None,
            message: String::new(),
        }
    }
}

impl From<Result<(), Rejection>> for PodAdmitResult {
    fn from(r: Result<(), Rejection>) -> PodAdmitResult {
        match r {
            Ok(()) => PodAdmitResult::admitted(),
            Err(r) => PodAdmitResult {
                admit: false,
                reason: Some(r.reason),
                message: r.message,
            },
        }
    }
}

/// upstream's PodAdmitAttributes: the pod and the other pods already admitted and active.
pub struct PodAdmitAttributes<'a> {
    pub pod: &'a Pod,
    pub other_pods: &'a [std::sync::Arc<Pod>],
}

/// One manager's admission check. Asynchronous because the device manager asks its
/// plugins (Allocate) while admitting.
pub trait PodAdmitHandler: Send + Sync {
    fn admit<'a>(&'a self, attrs: &'a PodAdmitAttributes<'a>) -> BoxFuture<'a, PodAdmitResult>;
}

/// The handlers in the order they run.
#[derive(Clone, Default)]
pub struct Handlers(Vec<Arc<dyn PodAdmitHandler>>);

impl Handlers {
    pub fn add(&mut self, h: Arc<dyn PodAdmitHandler>) {
        self.0.push(h);
    }

    /// Runs the chain; the first refusal wins (upstream's canAdmitPod).
    pub async fn admit(&self, attrs: &PodAdmitAttributes<'_>) -> PodAdmitResult {
        for h in &self.0 {
            let r = h.admit(attrs).await;
            if !r.admit {
                return r;
            }
        }
        PodAdmitResult::admitted()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Option<Reason>);
    impl PodAdmitHandler for Fixed {
        fn admit<'a>(&'a self, _: &'a PodAdmitAttributes<'a>) -> BoxFuture<'a, PodAdmitResult> {
            let r = match &self.0 {
                None => Ok(()),
                Some(reason) => Err(Rejection {
                    reason: reason.clone(),
                    message: "m".into(),
                }),
            };
            Box::pin(async move { r.into() })
        }
    }

    #[tokio::test]
    async fn first_refusal_wins() {
        let mut chain = Handlers::default();
        chain.add(Arc::new(Fixed(None)));
        chain.add(Arc::new(Fixed(Some(Reason::Evicted))));
        chain.add(Arc::new(Fixed(Some(Reason::OutOf("cpu".into())))));
        let pod = Pod::default();
        let r = chain
            .admit(&PodAdmitAttributes {
                pod: &pod,
                other_pods: &[],
            })
            .await;
        assert!(!r.admit);
        assert_eq!(r.reason.unwrap().as_string(), "Evicted");
        assert!(
            Handlers::default()
                .admit(&PodAdmitAttributes {
                    pod: &pod,
                    other_pods: &[]
                })
                .await
                .admit
        );
        assert_eq!(Reason::OutOf("cpu".into()), "OutOfcpu");
    }
}
