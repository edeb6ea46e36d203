//! ListPodSandboxMetrics: each ready pod's network counters (as cAdvisor's pod-level
//! `container="POD"` series) and each running container's CPU and memory, as the metrics
//! ListMetricDescriptors declares. Read live, so every timestamp is 0 as the CRI asks.

use super::Inner;
use super::list_metric_descriptors::{BASE_LABELS, CriMetric};
use crate::state::{ContainerState, SandboxState};
use cri::runtime::v1 as pb;

/// The values of [`BASE_LABELS`] for one series.
#[derive(Debug, Clone, Default)]
pub(crate) struct SeriesLabels {
    pub container: String,
    pub id: String,
    pub image: String,
    pub name: String,
    pub namespace: String,
    pub pod: String,
}

impl SeriesLabels {
    fn metric(&self, m: CriMetric, extra: &[&str], value: Option<u64>) -> Option<pb::Metric> {
        debug_assert_eq!(extra.len(), m.extra_labels().len());
        debug_assert_eq!(BASE_LABELS.len(), 6);
        let base = [
            &self.container,
            &self.id,
            &self.image,
            &self.name,
            &self.namespace,
            &self.pod,
        ];
        Some(pb::Metric {
            name: m.name().to_string(),
            timestamp: 0,
            metric_type: m.kind() as i32,
            label_values: base
                .iter()
                .map(|v| v.to_string())
                .chain(extra.iter().map(|v| v.to_string()))
                .collect(),
            value: Some(pb::UInt64Value { value: value? }),
        })
    }
}

/// A container's CPU and memory series. The CRI carries integers: CPU time is whole
/// seconds (as CRI-O reports it).
pub(crate) fn container_metrics(
    l: &SeriesLabels,
    cpu: Option<&pb::CpuUsage>,
    memory: Option<&pb::MemoryUsage>,
) -> Vec<pb::Metric> {
    let v = |x: &Option<pb::UInt64Value>| x.as_ref().map(|v| v.value);
    let mut out = Vec::new();
    if let Some(c) = cpu {
        out.extend(l.metric(
            CriMetric::CpuUsageSecondsTotal,
            &["total"],
            v(&c.usage_core_nano_seconds).map(|ns| ns / 1_000_000_000),
        ));
    }
    if let Some(m) = memory {
        out.extend(l.metric(CriMetric::MemoryUsageBytes, &[], v(&m.usage_bytes)));
        out.extend(l.metric(
            CriMetric::MemoryWorkingSetBytes,
            &[],
            v(&m.working_set_bytes),
        ));
        out.extend(l.metric(CriMetric::MemoryRss, &[], v(&m.rss_bytes)));
        out.extend(l.metric(
            CriMetric::MemoryFailuresTotal,
            &["pgfault", "container"],
            v(&m.page_faults),
        ));
        out.extend(l.metric(
            CriMetric::MemoryFailuresTotal,
            &["pgmajfault", "container"],
            v(&m.major_page_faults),
        ));
    }
    out
}

/// A pod's network series, one set per interface.
pub(crate) fn network_metrics(
    l: &SeriesLabels,
    interfaces: &[pb::NetworkInterfaceUsage],
) -> Vec<pb::Metric> {
    let v = |x: &Option<pb::UInt64Value>| x.as_ref().map(|v| v.value);
    let mut out = Vec::new();
    for i in interfaces {
        let name = [i.name.as_str()];
        out.extend(l.metric(CriMetric::NetworkReceiveBytesTotal, &name, v(&i.rx_bytes)));
        out.extend(l.metric(CriMetric::NetworkReceiveErrorsTotal, &name, v(&i.rx_errors)));
        out.extend(l.metric(CriMetric::NetworkTransmitBytesTotal, &name, v(&i.tx_bytes)));
        out.extend(l.metric(
            CriMetric::NetworkTransmitErrorsTotal,
            &name,
            v(&i.tx_errors),
        ));
    }
    out
}

pub fn list_pod_sandbox_metrics(
    inner: &Inner,
    _req: pb::ListPodSandboxMetricsRequest,
) -> Result<pb::ListPodSandboxMetricsResponse, tonic::Status> {
    let sandboxes: Vec<_> = inner
        .sandboxes()
        .values()
        .filter(|s| s.state == SandboxState::Ready)
        .cloned()
        .collect();
    let mut pod_metrics = Vec::with_capacity(sandboxes.len());
    for sb in sandboxes {
        let meta = sb.config().metadata.unwrap_or_default();
        let pod = SeriesLabels {
            container: "POD".into(),
            id: sb.id.clone(),
            image: String::new(),
            name: sb.name.clone(),
            namespace: meta.namespace.clone(),
            pod: meta.name.clone(),
        };
        let interfaces = sb
            .netns
            .as_deref()
            .map(super::stats::net_dev)
            .unwrap_or_default();
        let containers: Vec<_> = inner
            .containers()
            .values()
            .filter(|c| c.sandbox_id == sb.id && c.state == ContainerState::Running)
            .cloned()
            .collect();
        let container_metrics = containers
            .iter()
            .map(|c| {
                let labels = SeriesLabels {
                    container: c.config().metadata.map(|m| m.name).unwrap_or_default(),
                    id: c.id.clone(),
                    image: c.image_ref.clone(),
                    name: c.name.clone(),
                    ..pod.clone()
                };
                let cgroup = super::stats::cgroups_path(&c.bundle);
                // Cumulative CPU only: a rate here would move the samples ContainerStats
                // computes nano-cores against.
                let (cpu, memory) = super::stats::cpu_and_memory(inner, None, cgroup.as_deref());
                pb::ContainerMetrics {
                    container_id: c.id.clone(),
                    metrics: container_metrics(&labels, cpu.as_ref(), memory.as_ref()),
                }
            })
            .collect();
        pod_metrics.push(pb::PodSandboxMetrics {
            pod_sandbox_id: sb.id.clone(),
            metrics: network_metrics(&pod, &interfaces),
            container_metrics,
        });
    }
    Ok(pb::ListPodSandboxMetricsResponse { pod_metrics })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(v: u64) -> Option<pb::UInt64Value> {
        Some(pb::UInt64Value { value: v })
    }

    #[test]
    fn series_carry_cadvisor_labels_in_descriptor_order() {
        let l = SeriesLabels {
            container: "app".into(),
            id: "c1".into(),
            image: "busybox".into(),
            name: "app_web_default_uid_0".into(),
            namespace: "default".into(),
            pod: "web".into(),
        };
        let cpu = pb::CpuUsage {
            usage_core_nano_seconds: u(2_500_000_000),
            ..Default::default()
        };
        let mem = pb::MemoryUsage {
            usage_bytes: u(300),
            working_set_bytes: u(200),
            rss_bytes: u(100),
            page_faults: u(7),
            major_page_faults: None,
            ..Default::default()
        };
        let m = container_metrics(&l, Some(&cpu), Some(&mem));
        let cpu = m
            .iter()
            .find(|m| m.name == "container_cpu_usage_seconds_total")
            .unwrap();
        assert_eq!(
            cpu.label_values,
            [
                "app",
                "c1",
                "busybox",
                "app_web_default_uid_0",
                "default",
                "web",
                "total"
            ]
        );
        assert_eq!(cpu.value.as_ref().unwrap().value, 2);
        assert_eq!(cpu.metric_type, pb::MetricType::Counter as i32);
        let ws = m
            .iter()
            .find(|m| m.name == "container_memory_working_set_bytes")
            .unwrap();
        assert_eq!((ws.value.as_ref().unwrap().value, ws.metric_type), (200, 1));
        // A value the kernel did not give is left out rather than reported as 0.
        let faults: Vec<&[String]> = m
            .iter()
            .filter(|m| m.name == "container_memory_failures_total")
            .map(|m| &m.label_values[6..])
            .collect();
        assert_eq!(faults, [["pgfault".to_string(), "container".to_string()]]);

        let pod = SeriesLabels {
            container: "POD".into(),
            ..l
        };
        let net = network_metrics(
            &pod,
            &[pb::NetworkInterfaceUsage {
                name: "eth0".into(),
                rx_bytes: u(10),
                rx_errors: u(0),
                tx_bytes: u(20),
                tx_errors: u(1),
            }],
        );
        assert_eq!(net.len(), 4);
        let tx = net
            .iter()
            .find(|m| m.name == "container_network_transmit_bytes_total")
            .unwrap();
        assert_eq!(tx.label_values[0], "POD");
        assert_eq!(tx.label_values.last().map(String::as_str), Some("eth0"));
        assert_eq!(tx.value.as_ref().unwrap().value, 20);
    }
}
