//! The namespaces a request names, read from its first message's bytes without decoding the
//! rest: the auth layer judges a caller on them, and the grouping layer finds the call's group
//! from them (docs/sharding.md §4). [`methods::Names`] says where in each RPC's message they
//! are; only those fields are decoded, every other field is skipped unread.

use prost::Message;
use tonic::Status;

use crate::api::stack::methods::Names;

/// The namespaces `message` names where `names` says, sorted and without repeats; `None` for
/// [`Names::All`] (every namespace: no field names them).
pub fn namespaces(names: Names, message: &[u8]) -> Result<Option<Vec<String>>, Status> {
    let undecodable = |e: prost::DecodeError| {
        Status::invalid_argument(format!("the request message does not decode: {e}"))
    };
    Ok(Some(match names {
        Names::All => return Ok(None),
        Names::Field1 => vec![Named::decode(message).map_err(undecodable)?.namespace],
        Names::EachOf1 => {
            let each = EachNamed::decode(message).map_err(undecodable)?.items;
            let mut names: Vec<String> = each.into_iter().map(|n| n.namespace).collect();
            names.sort_unstable();
            names.dedup();
            names
        }
        Names::InnerOf1 => {
            let inner = Nested::decode(message).map_err(undecodable)?.inner;
            vec![inner.unwrap_or_default().namespace]
        }
    }))
}

/// A request whose field 1 is a namespace (every other field skipped unread).
#[derive(Clone, PartialEq, prost::Message)]
struct Named {
    #[prost(string, tag = "1")]
    namespace: String,
}

/// A request whose field 1 is a list of [`Named`].
#[derive(Clone, PartialEq, prost::Message)]
struct EachNamed {
    #[prost(message, repeated, tag = "1")]
    items: Vec<Named>,
}

/// A request whose field 1 is a [`Named`].
#[derive(Clone, PartialEq, prost::Message)]
struct Nested {
    #[prost(message, optional, tag = "1")]
    inner: Option<Named>,
}
