//! Compiles the Kubernetes API protobuf schemas (proto/k8s) into a descriptor set with
//! protox (pure Rust, no system `protoc`), for the API server's protobuf transcoder.

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
