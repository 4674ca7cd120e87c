//! Generates the gRPC code from proto/ with protox (a pure-Rust protobuf compiler), so building
//! timerdb needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    rocksdb_is_built()?;
    let protos = [
        "proto/timerdb/v1/timerdb.proto",
        "proto/timerdb/v1/raft.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    // The same descriptors, encoded, for gRPC server reflection (generic tools like grpcurl).
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("timerdb_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    let encoded = prost::Message::encode_to_vec(&fds);
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    // serde for every message (the HTTP/JSON API, docs/http.md): the proto3 JSON mapping with
    // the proto field names, every field written, unknown fields refused.
    pbjson_build::Builder::new()
        .register_descriptors(&encoded)?
        .preserve_proto_field_names()
        .emit_fields()
        .build(&[".timerdb.v1"])?;
    Ok(())
}

/// RocksDB is linked from the machine's cache (`.cargo/config.toml`, `scripts/rocksdb.sh`): say
/// so plainly when it is not built yet, instead of a linker error at the end of the build.
fn rocksdb_is_built() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-env-changed=ROCKSDB_LIB_DIR");
    println!("cargo:rerun-if-env-changed=ROCKSDB_COMPILE");
    let compile = std::env::var("ROCKSDB_COMPILE").is_ok_and(|v| v == "1" || v == "true");
    let Ok(dir) = std::env::var("ROCKSDB_LIB_DIR") else {
        return Ok(());
    };
    let archive = std::path::Path::new(&dir).join("librocksdb.a");
    if compile || archive.exists() {
        return Ok(());
    }
    Err(format!(
        "RocksDB is not built yet ({} is missing). Run `scripts/rocksdb.sh` once: it compiles \
         RocksDB once for this machine (~10 min on 2 cores) and every build links it. Or set \
         ROCKSDB_COMPILE=1 to compile it into this target directory instead.",
        archive.display()
    )
    .into())
}
