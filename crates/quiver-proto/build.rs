//! Compiles `proto/quiver/registry/v1/registry.proto` with the vendored
//! `protoc`, so no system protobuf compiler is needed, and writes the file
//! descriptor set that the registry serves through gRPC reflection.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let proto = root.join("quiver/registry/v1/registry.proto");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);

    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    let well_known = protoc_bin_vendored::include_path()?;

    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("quiver_registry_v1_descriptor.bin"))
        .compile_with_config(config, std::slice::from_ref(&proto), &[root, well_known])?;
    println!("cargo:rerun-if-changed={}", proto.display());
    Ok(())
}
