//! OCI runtime spec from a CRI ContainerConfig. Being written.
