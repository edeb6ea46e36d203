//! Compiles the vendored protos with protox (pure Rust), so building nodus never needs a
//! system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/runtime/v1/api.proto",
        "proto/deviceplugin/v1beta1/api.proto",
        "proto/podresources/v1/api.proto",
        "proto/nri/api.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    // Kept for clients that print messages as protobuf JSON (crictl's output format).
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("cri_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Unimplemented RPCs answer codes.Unimplemented, which CRI clients handle.
        .generate_default_stubs(true)
        .compile_fds(fds)?;
    Ok(())
}
