//! Compiles the Kubernetes API protobuf schemas (proto/k8s) into a descriptor set with
//! protox (pure Rust, no system `protoc`), for the API server's protobuf transcoder, and
//! etcd's v3 API subset (proto/etcd) into a gRPC client for the etcd storage backend.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new("proto/k8s");
    let mut protos = Vec::new();
    collect(root, root, &mut protos)?;
    protos.sort();
    println!("cargo:rerun-if-changed=proto/k8s");
    for p in &protos {
        println!("cargo:rerun-if-changed=proto/k8s/{p}");
    }
    let fds = protox::compile(&protos, [root])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("k8s_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    let etcd = ["proto/etcd/kv.proto", "proto/etcd/rpc.proto"];
    for p in etcd {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(etcd, ["proto/etcd"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}

/// Every `.proto` file under `dir`, as a path relative to `root` (the import root).
fn collect(
    root: &std::path::Path,
    dir: &std::path::Path,
    out: &mut Vec<String>,
) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(root, &path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto")
            && let Ok(rel) = path.strip_prefix(root)
        {
            out.push(rel.to_string_lossy().into_owned());
        }
    }
    Ok(())
}
