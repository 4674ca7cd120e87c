//! The OpenAPI 3.0 document of the HTTP API, generated from the route table and the message
//! descriptors (so it cannot drift from what is served), at `GET /v1/openapi.json`.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use prost_types::field_descriptor_proto::Type;
use prost_types::FieldDescriptorProto;
use serde_json::{json, Map, Value};

use super::routes::{Input, Output, ROUTES};
use super::schema::{self, schema};

/// The document (built once).
pub fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(build)
}

fn build() -> Value {
    let mut paths = Map::new();
    let mut wanted = BTreeSet::new();
    for route in ROUTES {
        let mut params: Vec<Value> = route
            .params()
            .map(|name| {
                json!({"name": name, "in": "path", "required": true,
                       "schema": param_schema(route.request, name)})
            })
            .collect();
        let path_params: Vec<&str> = route.params().collect();
        let mut op = Map::new();
        op.insert("operationId".into(), route.operation_id().into());
        op.insert("summary".into(), route.summary.into());
        op.insert("tags".into(), json!([service_of(route.rpc)]));
        match route.input {
            Input::Query => {
                for f in query_fields(route.request) {
                    if path_params.contains(&f.name()) {
                        continue;
                    }
                    params.push(json!({"name": f.name(), "in": "query", "required": false,
                                       "schema": field_schema(f)}));
                }
            }
            Input::Body => {
                wanted.insert(route.request.to_string());
                op.insert(
                    "requestBody".into(),
                    json!({"required": false, "content": {"application/json": {
                        "schema": reference(route.request)}}}),
                );
            }
        }
        wanted.insert(route.response.to_string());
        let ok = match route.output {
            Output::Unary => json!({"description": "OK", "content": {"application/json": {
                "schema": reference(route.response)}}}),
            Output::Backup => json!({
                "description": "The backup file (restore it with timerd --restore-from); \
                                its BackupInfo as JSON in the x-timerdb-backup header",
                "content": {"application/octet-stream": {"schema": {"type": "string",
                    "format": "binary"}}}}),
            Output::Lines => json!({
                "description": "A stream of JSON objects, one per line, each one Delivery \
                                (or, last, an Error)",
                "content": {"application/x-ndjson": {"schema": reference(route.response)}}}),
        };
        op.insert("parameters".into(), Value::Array(params));
        op.insert(
            "responses".into(),
            json!({"200": ok, "default": {"description": "A refusal (4xx) or a failure",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}}),
        );
        // `{id}:reschedule` is written `{id}:reschedule` in OpenAPI too.
        let entry = paths
            .entry(route.path.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        entry[route.method.as_str().to_ascii_lowercase()] = Value::Object(op);
    }
    paths.insert(
        "/v1/openapi.json".into(),
        json!({"get": {"operationId": "OpenApi", "summary": "This document.",
            "responses": {"200": {"description": "OK",
                "content": {"application/json": {"schema": {"type": "object"}}}}}}}),
    );
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "timerdb HTTP/JSON API",
            "version": "v1",
            "description": "The gRPC services of timerdb.v1 as JSON over HTTP (docs/http.md). \
                Every node serves every call; writes are forwarded to the leader. 64-bit \
                integers are JSON strings; enums are names; payload is base64 (or give \
                payload_json).",
        },
        "paths": paths,
        "components": {
            "schemas": schemas(wanted),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                "description": "An API key, tdbk_<id>_<secret>, once auth is on"}},
        },
        "security": [{}, {"bearer": []}],
    })
}

fn service_of(rpc: &str) -> &str {
    rpc.trim_start_matches('/')
        .split('/')
        .next()
        .and_then(|s| s.rsplit('.').next())
        .unwrap_or(rpc)
}

fn reference(message: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{message}")})
}

/// The scalar, non-repeated fields of a request message (what a query can carry).
fn query_fields(message: &str) -> Vec<&'static FieldDescriptorProto> {
    let Some(m) = schema().messages.get(message) else {
        return Vec::new();
    };
    m.field
        .iter()
        .filter(|f| {
            !schema::repeated(f) && f.r#type() != Type::Message && f.r#type() != Type::Bytes
        })
        .collect()
}

fn param_schema(message: &str, name: &str) -> Value {
    schema()
        .messages
        .get(message)
        .and_then(|m| schema::field(m, name))
        .map(field_schema)
        .unwrap_or_else(|| json!({"type": "string"}))
}

/// Every message `roots` reach, with the error shape.
fn schemas(roots: BTreeSet<String>) -> Value {
    let s = schema();
    let mut out = Map::new();
    let mut todo: Vec<String> = roots.into_iter().collect();
    while let Some(name) = todo.pop() {
        if out.contains_key(&name) {
            continue;
        }
        let Some(m) = s.messages.get(&name) else {
            continue;
        };
        let mut props = Map::new();
        for f in &m.field {
            if f.r#type() == Type::Message {
                todo.push(schema::short(f.type_name()).to_string());
            }
            props.insert(f.name().to_string(), field_schema(f));
            if f.name() == "payload" {
                props.insert(
                    "payload_json".into(),
                    json!({"description": "The payload as a JSON value instead of base64 \
                        (requests; answers carry it when the content type is JSON)"}),
                );
            }
        }
        out.insert(name, json!({"type": "object", "properties": props}));
    }
    out.insert(
        "Error".into(),
        json!({"type": "object", "properties": {"error": {"type": "object", "properties": {
            "code": {"type": "integer", "description": "the HTTP status"},
            "status": {"type": "string", "description": "the gRPC code's name"},
            "message": {"type": "string"}}}}}),
    );
    Value::Object(out)
}

fn field_schema(f: &FieldDescriptorProto) -> Value {
    let one = match f.r#type() {
        Type::String => json!({"type": "string"}),
        Type::Bytes => json!({"type": "string", "format": "byte"}),
        Type::Bool => json!({"type": "boolean"}),
        Type::Int32 | Type::Sint32 | Type::Sfixed32 => {
            json!({"type": "integer", "format": "int32"})
        }
        Type::Uint32 | Type::Fixed32 => {
            json!({"type": "integer", "format": "int64", "minimum": 0, "maximum": u32::MAX})
        }
        Type::Int64 | Type::Sint64 | Type::Sfixed64 => json!({"type": "string", "format": "int64"}),
        Type::Uint64 | Type::Fixed64 => json!({"type": "string", "format": "uint64"}),
        Type::Double | Type::Float => json!({"type": "number"}),
        Type::Enum => {
            let names: Vec<&str> = schema()
                .enums
                .get(schema::short(f.type_name()))
                .map(|e| e.value.iter().map(|v| v.name()).collect())
                .unwrap_or_default();
            json!({"type": "string", "enum": names})
        }
        Type::Message => reference(schema::short(f.type_name())),
        Type::Group => json!({}),
    };
    if schema::repeated(f) {
        json!({"type": "array", "items": one})
    } else {
        one
    }
}
