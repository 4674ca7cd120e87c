//! What the HTTP layer knows of the protobuf messages, read from their descriptors (the same
//! encoded set server reflection serves): the type of each field, so a query parameter becomes
//! a JSON value of the right type, an enum may be named briefly (`pending`), a payload may be
//! given and shown as JSON (`payload_json`), and the OpenAPI document describes every message.

use std::collections::HashMap;
use std::sync::OnceLock;

use base64::Engine;
use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, EnumDescriptorProto, FieldDescriptorProto};
use serde_json::{Map, Value};

/// The package every route's messages are in.
pub const PACKAGE: &str = "timerdb.v1";

/// The messages and enums of [`PACKAGE`], by short name.
pub struct Schema {
    pub messages: HashMap<String, DescriptorProto>,
    pub enums: HashMap<String, EnumDescriptorProto>,
}

/// The schema, read once from the compiled-in descriptors.
pub fn schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let set = prost_types::FileDescriptorSet::decode(crate::api::FILE_DESCRIPTOR_SET)
            .expect("the compiled-in descriptors decode");
        let mut messages = HashMap::new();
        let mut enums = HashMap::new();
        for file in set.file.into_iter().filter(|f| f.package() == PACKAGE) {
            for e in file.enum_type {
                enums.insert(e.name().to_string(), e);
            }
            for m in file.message_type {
                // Nested enums (none today) would be named Outer.Inner.
                for e in &m.enum_type {
                    enums.insert(format!("{}.{}", m.name(), e.name()), e.clone());
                }
                messages.insert(m.name().to_string(), m);
            }
        }
        Schema { messages, enums }
    })
}

/// `fire_at_ms` → `fireAtMs` (the proto3 JSON name).
pub fn camel(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// The short name of a type reference: `.timerdb.v1.Timer` → `Timer`.
pub fn short(type_name: &str) -> &str {
    type_name
        .strip_prefix('.')
        .and_then(|t| t.strip_prefix(PACKAGE))
        .and_then(|t| t.strip_prefix('.'))
        .unwrap_or(type_name)
}

/// The field of `message` a JSON key names (proto name or lowerCamelCase).
pub fn field<'a>(message: &'a DescriptorProto, key: &str) -> Option<&'a FieldDescriptorProto> {
    message
        .field
        .iter()
        .find(|f| f.name() == key || camel(f.name()) == key)
}

pub fn repeated(f: &FieldDescriptorProto) -> bool {
    f.label() == Label::Repeated
}

/// The JSON value of a query parameter for `field` of `message`.
pub fn query_value(message: &str, key: &str, raw: &str) -> Result<(String, Value), String> {
    let s = schema();
    let unknown = || format!("unknown query parameter {key}");
    let m = s.messages.get(message).ok_or_else(unknown)?;
    let f = field(m, key).ok_or_else(unknown)?;
    let bad = |what: &str| format!("the query parameter {key} must be {what}, not {raw:?}");
    let value = match f.r#type() {
        Type::String => Value::String(raw.to_string()),
        Type::Bool => match raw {
            "true" | "1" | "" => Value::Bool(true),
            "false" | "0" => Value::Bool(false),
            _ => return Err(bad("true or false")),
        },
        Type::Int32
        | Type::Sint32
        | Type::Sfixed32
        | Type::Int64
        | Type::Sint64
        | Type::Sfixed64 => Value::from(raw.parse::<i64>().map_err(|_| bad("an integer"))?),
        Type::Uint32 | Type::Fixed32 | Type::Uint64 | Type::Fixed64 => Value::from(
            raw.parse::<u64>()
                .map_err(|_| bad("a non-negative integer"))?,
        ),
        Type::Enum => enum_value(s, f, raw)?,
        _ => {
            return Err(format!(
                "{key} cannot be given in the query: send it in a body"
            ))
        }
    };
    if repeated(f) {
        return Err(format!(
            "{key} cannot be given in the query: send it in a body"
        ));
    }
    Ok((f.name().to_string(), value))
}

/// An enum value as given (number, full name or short lowercase name) → its full name.
fn enum_value(s: &Schema, f: &FieldDescriptorProto, given: &str) -> Result<Value, String> {
    let Some(e) = s.enums.get(short(f.type_name())) else {
        return Ok(Value::String(given.to_string()));
    };
    if let Ok(n) = given.parse::<i32>() {
        return Ok(Value::from(n));
    }
    let upper = given.to_ascii_uppercase();
    let prefix = enum_prefix(e);
    let found = e.value.iter().find(|v| {
        v.name() == upper || v.name().strip_prefix(prefix.as_str()) == Some(upper.as_str())
    });
    match found {
        Some(v) => Ok(Value::String(v.name().to_string())),
        None => {
            let names: Vec<String> = e
                .value
                .iter()
                .filter(|v| v.number() != 0)
                .map(|v| {
                    v.name()
                        .strip_prefix(prefix.as_str())
                        .unwrap_or(v.name())
                        .to_ascii_lowercase()
                })
                .collect();
            Err(format!(
                "{} is not a {}: one of {}",
                Value::String(given.to_string()),
                e.name(),
                names.join(", ")
            ))
        }
    }
}

/// `TimerState` → `TIMER_STATE_` (the prefix its value names share).
fn enum_prefix(e: &EnumDescriptorProto) -> String {
    let mut out = String::new();
    for (i, c) in e.name().chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out.push('_');
    out
}

/// Rewrites a JSON request of `message` the friendly way into the mapping's: short enum names
/// to full ones, `payload_json` to `payload` (base64) with a JSON content type.
pub fn prepare(message: &str, value: &mut Value, at: &str) -> Result<(), String> {
    let s = schema();
    let Some(m) = s.messages.get(message) else {
        return Ok(());
    };
    let Value::Object(object) = value else {
        return Ok(());
    };
    if let Some(json) = object
        .remove("payload_json")
        .or_else(|| object.remove("payloadJson"))
    {
        if field(m, "payload").is_none() {
            return Err(format!("{at}payload_json: unknown field"));
        }
        if object.contains_key("payload") {
            return Err(format!("{at}payload and payload_json: give one of them"));
        }
        let bytes = serde_json::to_vec(&json).map_err(|e| e.to_string())?;
        let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
        object.insert("payload".into(), Value::String(encoded));
        let typed = ["content_type", "contentType"]
            .iter()
            .any(|k| object.get(*k).is_some_and(|v| v.as_str() != Some("")));
        if !typed && field(m, "content_type").is_some() {
            object.insert("content_type".into(), "application/json".into());
        }
    }
    for (key, v) in object.iter_mut() {
        let Some(f) = field(m, key) else {
            continue; // pbjson names the unknown field
        };
        let here = format!("{at}{key}.");
        match f.r#type() {
            Type::Enum => {
                if let Value::String(given) = v {
                    *v = enum_value(s, f, given).map_err(|e| format!("{at}{key}: {e}"))?;
                }
            }
            Type::Message => {
                let inner = short(f.type_name()).to_string();
                match v {
                    Value::Array(items) if repeated(f) => {
                        for (i, item) in items.iter_mut().enumerate() {
                            prepare(&inner, item, &format!("{at}{key}[{i}]."))?;
                        }
                    }
                    other => prepare(&inner, other, &here)?,
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Adds `payload_json` beside every JSON payload of a response (timers whose content type is
/// JSON and whose payload parses).
pub fn decorate(value: &mut Value) {
    match value {
        Value::Object(object) => {
            add_payload_json(object);
            object.values_mut().for_each(decorate);
        }
        Value::Array(items) => items.iter_mut().for_each(decorate),
        _ => {}
    }
}

fn add_payload_json(object: &mut Map<String, Value>) {
    let json_type = object
        .get("content_type")
        .and_then(Value::as_str)
        .is_some_and(is_json_type);
    if !json_type {
        return;
    }
    let Some(Value::String(b64)) = object.get("payload") else {
        return;
    };
    let parsed = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok());
    if let Some(json) = parsed {
        object.insert("payload_json".into(), json);
    }
}

/// `application/json`, `application/problem+json; charset=utf-8`, …
pub fn is_json_type(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
        || essence.to_ascii_lowercase().ends_with("+json")
}
