//! Compiles the vendored protos with protox (pure Rust), so building nodus never needs a
//! system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/runtime/v1/api.proto",
        "proto/deviceplugin/v1beta1/api.proto",
        "proto/podresources/v1/api.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
