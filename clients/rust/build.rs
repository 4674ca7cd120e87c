//! Generates the gRPC code of `timerdb.v1` from the repository's proto/ with protox (a pure-Rust
//! protobuf compiler, so no system `protoc`): messages, client and server stubs (the server,
//! timerdb, uses these same types), serde for every message (the proto3 JSON mapping with proto
//! field names, pbjson), and the encoded descriptors.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new("../../proto");
    let protos = [
        root.join("timerdb/v1/timerdb.proto"),
        root.join("timerdb/v1/raft.proto"),
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    let fds = protox::compile(&protos, [root])?;
    let encoded = prost::Message::encode_to_vec(&fds);
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    // For gRPC server reflection (grpcurl) and the HTTP API's schema.
    std::fs::write(out.join("timerdb_descriptor.bin"), &encoded)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    pbjson_build::Builder::new()
        .register_descriptors(&encoded)?
        .preserve_proto_field_names()
        .emit_fields()
        .build(&[".timerdb.v1"])?;
    Ok(())
}
