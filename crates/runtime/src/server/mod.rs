//! gRPC services of the CRI server.
