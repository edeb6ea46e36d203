//! The real kubectl's typed clients send bodies of built-in kinds as
//! `application/vnd.kubernetes.protobuf`: `create configmap|deployment|namespace|secret|
//! serviceaccount|service` and `scale` must succeed against nodus, silently, and store what
//! the equivalent JSON would have stored.

mod common;

// The transcoder's own unit tests run from here too, so they run even before the API
// server links the module in.
#[allow(dead_code)]
#[path = "../src/apiserver/protobuf/mod.rs"]
mod protobuf;
