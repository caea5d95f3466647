//! Generates the Rust types of `proto/bus.proto` with prost-build, using the
//! `protoc` shipped by `protoc-bin-vendored` so no system protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto/bus.proto");
    prost_build::Config::new()
        .btree_map(["."])
        // A line batch is passed on without a copy (`proto::lines`).
        .bytes([".dws.bus.v1.LineBatch"])
        .compile_protos(&["proto/bus.proto"], &["proto"])?;
    Ok(())
}
