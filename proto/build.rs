//! Generates the gRPC code of `timerdb.v1` from the .proto files beside this crate, with protox
//! (a pure-Rust protobuf compiler, so no system `protoc`): messages and client stubs always;
//! server stubs with the `server` feature; the peer-only `Raft` service (raft.proto) with the
//! `peer` feature; serde for every message (the proto3 JSON mapping with proto field names,
//! pbjson); and the encoded descriptors of what was compiled.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = std::env::var_os("CARGO_FEATURE_SERVER").is_some();
    let peer = std::env::var_os("CARGO_FEATURE_PEER").is_some();
    let root = std::path::Path::new("timerdb/v1");
    let mut protos = vec![root.join("timerdb.proto")];
    if peer {
        protos.push(root.join("raft.proto"));
    }
    for p in &protos {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    let fds = protox::compile(&protos, ["."])?;
    let encoded = prost::Message::encode_to_vec(&fds);
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    // For gRPC server reflection (grpcurl) and the HTTP API's schema.
    std::fs::write(out.join("timerdb_descriptor.bin"), &encoded)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(server)
        .compile_fds(fds)?;
    pbjson_build::Builder::new()
        .register_descriptors(&encoded)?
        .preserve_proto_field_names()
        .emit_fields()
        .build(&[".timerdb.v1"])?;
    Ok(())
}
