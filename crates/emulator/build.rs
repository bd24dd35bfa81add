//! Compiles the vendored Kubernetes `.proto` files (protos/, see protos/refresh.sh) into one
//! descriptor set, which `src/protobuf.rs` reads to decode protobuf request bodies. protox is a
//! protobuf compiler in Rust: no `protoc` on the build machine.

use std::path::{Path, PathBuf};

fn main() {
    let protos = Path::new("protos");
    println!("cargo::rerun-if-changed=protos");
    let mut files = Vec::new();
    collect(protos, &mut files);
    files.sort();
    let set = protox::Compiler::new([protos])
        .and_then(|mut compiler| {
            // The comments are the API's documentation, for the OpenAPI documents (`kubectl explain`).
            compiler.include_imports(true).include_source_info(true);
            compiler.open_files(&files)?;
            Ok(compiler.encode_file_descriptor_set())
        })
        .unwrap_or_else(|e| panic!("compiling the vendored .proto files: {e}"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out.join("kubernetes.fds"), set).expect("writing the descriptor set");
}

/// Every `.proto` under `dir`, as paths relative to protos/ (what imports name).
fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("reading protos/") {
        let path = entry.expect("reading protos/").path();
        if path.is_dir() {
            collect(&path, files);
        } else if path.extension().is_some_and(|e| e == "proto") {
            files.push(
                path.strip_prefix("protos")
                    .expect("under protos/")
                    .to_path_buf(),
            );
        }
    }
}
