//! The gRPC contracts a node speaks, generated at build time from vendored protos:
//!
//! * [`runtime::v1`]: the Container Runtime Interface (RuntimeService + ImageService), spoken
//!   between the kubelet and any container runtime (nodus's own, containerd, CRI-O).
//! * [`deviceplugin::v1beta1`]: the device plugin registration and plugin services.
//! * [`podresources::v1`]: the kubelet's pod resources lister.
//! * [`nri`]: containerd/nri's Node Resource Interface messages (spoken over ttrpc, so only
//!   the messages are generated; the runtime frames them itself).
//!
//! This crate owns only generated code; behaviour lives in the runtime and kubelet crates.

#![allow(clippy::all, clippy::pedantic, missing_docs)]

pub mod runtime {
    pub mod v1 {
        tonic::include_proto!("runtime.v1");
    }
}

pub mod deviceplugin {
    pub mod v1beta1 {
        tonic::include_proto!("v1beta1");
    }
}

pub mod podresources {
    pub mod v1 {
        tonic::include_proto!("v1");
    }
}

pub mod nri {
    tonic::include_proto!("nri.pkg.api.v1alpha1");
}

/// The encoded `FileDescriptorSet` of every proto above, for reflection (protobuf JSON output).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/cri_descriptor.bin"));

#[cfg(test)]
mod tests {
    use prost::Message as _;

    #[test]
    fn all_three_apis_are_compiled_with_upstream_field_numbers() {
        // Field numbers are the wire contract: a device plugin's Register must round-trip and
        // put resource_name in field 3, as upstream's kubelet reads it.
        let req = super::deviceplugin::v1beta1::RegisterRequest {
            version: "v1beta1".into(),
            endpoint: "gpu.sock".into(),
            resource_name: "example.com/gpu".into(),
            options: None,
        };
        let bytes = req.encode_to_vec();
        assert_eq!(bytes[0] >> 3, 1, "version is field 1");
        let back = super::deviceplugin::v1beta1::RegisterRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(back.resource_name, "example.com/gpu");
        let pr = super::podresources::v1::ListPodResourcesResponse {
            pod_resources: vec![super::podresources::v1::PodResources {
                name: "p".into(),
                namespace: "ns".into(),
                containers: vec![],
            }],
        };
        assert_eq!(
            super::podresources::v1::ListPodResourcesResponse::decode(
                pr.encode_to_vec().as_slice()
            )
            .unwrap()
            .pod_resources[0]
                .namespace,
            "ns"
        );
        let fds = prost_types_check(super::FILE_DESCRIPTOR_SET);
        for svc in ["runtime.v1", "v1beta1", "v1"] {
            assert!(fds.contains(&svc.to_string()), "{svc} missing from {fds:?}");
        }
    }

    /// The proto packages in the exported descriptor set (a FileDescriptorSet is field 1:
    /// repeated FileDescriptorProto, whose field 2 is the package).
    fn prost_types_check(bytes: &[u8]) -> Vec<String> {
        #[derive(Clone, PartialEq, prost::Message)]
        struct File {
            #[prost(string, tag = "2")]
            package: String,
        }
        #[derive(Clone, PartialEq, prost::Message)]
        struct Set {
            #[prost(message, repeated, tag = "1")]
            file: Vec<File>,
        }
        Set::decode(bytes)
            .unwrap()
            .file
            .into_iter()
            .map(|f| f.package)
            .collect()
    }
}
