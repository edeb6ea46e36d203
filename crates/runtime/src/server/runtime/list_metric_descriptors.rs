//! ListMetricDescriptors: the metrics ListPodSandboxMetrics reports, named and labelled as
//! cAdvisor names them (as CRI-O answers), so the kubelet's `/metrics/cadvisor` keeps its
//! series when it takes container metrics from the runtime instead of cAdvisor. Only the
//! metrics whose data the stats RPCs already read are offered.

use cri::runtime::v1 as pb;

/// cAdvisor's labels of a container's series, in the order their values are given.
pub(crate) const BASE_LABELS: [&str; 6] = ["container", "id", "image", "name", "namespace", "pod"];

/// One metric the runtime reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CriMetric {
    CpuUsageSecondsTotal,
    MemoryUsageBytes,
    MemoryWorkingSetBytes,
    MemoryRss,
    MemoryFailuresTotal,
    NetworkReceiveBytesTotal,
    NetworkReceiveErrorsTotal,
    NetworkTransmitBytesTotal,
    NetworkTransmitErrorsTotal,
}

impl CriMetric {
    pub(crate) const ALL: [CriMetric; 9] = [
        CriMetric::CpuUsageSecondsTotal,
        CriMetric::MemoryUsageBytes,
        CriMetric::MemoryWorkingSetBytes,
        CriMetric::MemoryRss,
        CriMetric::MemoryFailuresTotal,
        CriMetric::NetworkReceiveBytesTotal,
        CriMetric::NetworkReceiveErrorsTotal,
        CriMetric::NetworkTransmitBytesTotal,
        CriMetric::NetworkTransmitErrorsTotal,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            CriMetric::CpuUsageSecondsTotal => "container_cpu_usage_seconds_total",
            CriMetric::MemoryUsageBytes => "container_memory_usage_bytes",
            CriMetric::MemoryWorkingSetBytes => "container_memory_working_set_bytes",
            CriMetric::MemoryRss => "container_memory_rss",
            CriMetric::MemoryFailuresTotal => "container_memory_failures_total",
            CriMetric::NetworkReceiveBytesTotal => "container_network_receive_bytes_total",
            CriMetric::NetworkReceiveErrorsTotal => "container_network_receive_errors_total",
            CriMetric::NetworkTransmitBytesTotal => "container_network_transmit_bytes_total",
            CriMetric::NetworkTransmitErrorsTotal => "container_network_transmit_errors_total",
        }
    }

    fn help(self) -> &'static str {
        match self {
            CriMetric::CpuUsageSecondsTotal => "Cumulative cpu time consumed in seconds.",
            CriMetric::MemoryUsageBytes => {
                "Current memory usage in bytes, including all memory regardless of when it was accessed"
            }
            CriMetric::MemoryWorkingSetBytes => "Current working set in bytes.",
            CriMetric::MemoryRss => "Size of RSS in bytes.",
            CriMetric::MemoryFailuresTotal => "Cumulative count of memory allocation failures.",
            CriMetric::NetworkReceiveBytesTotal => "Cumulative count of bytes received",
            CriMetric::NetworkReceiveErrorsTotal => {
                "Cumulative count of errors encountered while receiving"
            }
            CriMetric::NetworkTransmitBytesTotal => "Cumulative count of bytes transmitted",
            CriMetric::NetworkTransmitErrorsTotal => {
                "Cumulative count of errors encountered while transmitting"
            }
        }
    }

    pub(crate) fn kind(self) -> pb::MetricType {
        match self {
            CriMetric::MemoryUsageBytes
            | CriMetric::MemoryWorkingSetBytes
            | CriMetric::MemoryRss => pb::MetricType::Gauge,
            _ => pb::MetricType::Counter,
        }
    }

    /// The labels beyond [`BASE_LABELS`], in order.
    pub(crate) fn extra_labels(self) -> &'static [&'static str] {
        match self {
            CriMetric::CpuUsageSecondsTotal => &["cpu"],
            CriMetric::MemoryFailuresTotal => &["failure_type", "scope"],
            CriMetric::NetworkReceiveBytesTotal
            | CriMetric::NetworkReceiveErrorsTotal
            | CriMetric::NetworkTransmitBytesTotal
            | CriMetric::NetworkTransmitErrorsTotal => &["interface"],
            _ => &[],
        }
    }

    fn descriptor(self) -> pb::MetricDescriptor {
        pb::MetricDescriptor {
            name: self.name().to_string(),
            help: self.help().to_string(),
            label_keys: BASE_LABELS
                .iter()
                .chain(self.extra_labels())
                .map(|k| k.to_string())
                .collect(),
        }
    }
}

pub fn list_metric_descriptors(
    _req: pb::ListMetricDescriptorsRequest,
) -> Result<pb::ListMetricDescriptorsResponse, tonic::Status> {
    Ok(pb::ListMetricDescriptorsResponse {
        descriptors: CriMetric::ALL.iter().map(|m| m.descriptor()).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_are_cadvisors() {
        let d = list_metric_descriptors(pb::ListMetricDescriptorsRequest {})
            .unwrap()
            .descriptors;
        assert_eq!(d.len(), CriMetric::ALL.len());
        let cpu = d
            .iter()
            .find(|m| m.name == "container_cpu_usage_seconds_total")
            .unwrap();
        assert_eq!(
            cpu.label_keys,
            [
                "container",
                "id",
                "image",
                "name",
                "namespace",
                "pod",
                "cpu"
            ]
        );
        let rx = d
            .iter()
            .find(|m| m.name == "container_network_receive_bytes_total")
            .unwrap();
        assert_eq!(rx.label_keys.last().map(String::as_str), Some("interface"));
        let mut names: Vec<&str> = d.iter().map(|m| m.name.as_str()).collect();
        names.dedup();
        assert_eq!(names.len(), d.len(), "names are unique");
    }
}
