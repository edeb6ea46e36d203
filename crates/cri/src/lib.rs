//! The gRPC contracts a node speaks, generated at build time from vendored protos:
//!
//! * [`runtime::v1`]: the Container Runtime Interface (RuntimeService + ImageService), spoken
//!   between the kubelet and any container runtime (nodus's own, containerd, CRI-O).
//! * [`deviceplugin::v1beta1`]: the device plugin registration and plugin services.
//! * [`podresources::v1`]: the kubelet's pod resources lister.
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

/// The encoded `FileDescriptorSet` of every proto above, for reflection (protobuf JSON output).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/cri_descriptor.bin"));
