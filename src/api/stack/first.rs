//! Reading a request's first gRPC message before its service does (the auth layer needs the
//! namespaces it names), without losing a byte: the bytes read are handed on, in order, ahead
//! of the rest of the body. The message may span chunks; its length is checked against the
//! service's limit before anything beyond its frame header is buffered, and a compressed
//! message is refused (we never read one).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Frame;
use tonic::body::Body;
use tonic::Status;

/// A gRPC message's frame header: compression flag, then the length (u32, big-endian).
pub const FRAME_HEADER_BYTES: usize = 5;

/// The first request message, read off a body.
pub struct First {
    /// The bytes read, as they came (the first frame and maybe more).
    chunks: VecDeque<Bytes>,
    /// The first message, without its frame header.
    pub message: Bytes,
    /// The body after the bytes read.
    rest: Body,
}

/// Reads the body up to the end of its first gRPC message, of at most `max` bytes.
pub async fn first_message(mut body: Body, max: usize) -> Result<First, Status> {
    let mut chunks = VecDeque::new();
    let mut have = 0usize;
    let mut need = None;
    loop {
        if need.is_none() && have >= FRAME_HEADER_BYTES {
            let head = gather(&chunks, FRAME_HEADER_BYTES);
            if head[0] != 0 {
                return Err(Status::invalid_argument(
                    "compressed request messages are not accepted",
                ));
            }
            let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
            if len > max {
                return Err(Status::resource_exhausted(format!(
                    "request message of {len} bytes; the limit is {max}"
                )));
            }
            need = Some(FRAME_HEADER_BYTES + len);
        }
        if let Some(n) = need {
            if have >= n {
                let mut all = gather(&chunks, n);
                all.advance(FRAME_HEADER_BYTES);
                return Ok(First {
                    chunks,
                    message: all,
                    rest: body,
                });
            }
        }
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    have += data.len();
                    chunks.push_back(data);
                }
            }
            Some(Err(e)) => return Err(Status::cancelled(format!("reading the request: {e}"))),
            None => {
                return Err(Status::invalid_argument(
                    "the request ended before its first message was whole",
                ))
            }
        }
    }
}

/// The first `n` bytes of `chunks` (no copy when the first chunk holds them).
fn gather(chunks: &VecDeque<Bytes>, n: usize) -> Bytes {
    if let Some(first) = chunks.front().filter(|c| c.len() >= n) {
        return first.slice(..n);
    }
    let mut out = BytesMut::with_capacity(n);
    for c in chunks {
        let take = (n - out.len()).min(c.len());
        out.extend_from_slice(&c[..take]);
        if out.len() == n {
            break;
        }
    }
    out.freeze()
}

/// A body that yields the bytes already read, then the rest of the original.
struct Prefixed {
    chunks: VecDeque<Bytes>,
    rest: Body,
}

impl hyper::body::Body for Prefixed {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(c) = self.chunks.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(c))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }
}

impl First {
    /// The whole body again: the bytes read, then the rest.
    pub fn hand_on(self) -> Body {
        Body::new(Prefixed {
            chunks: self.chunks,
            rest: self.rest,
        })
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::api::MAX_CLIENT_MESSAGE_BYTES;

    fn framed(msg: &impl Message) -> Vec<u8> {
        let body = msg.encode_to_vec();
        let mut out = vec![0u8];
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    #[tokio::test]
    async fn the_first_message_is_read_across_chunks_and_handed_on_whole() {
        let req = crate::api::pb::ScheduleRequest {
            namespace: "orders".into(),
            id: "x".repeat(100),
            ..Default::default()
        };
        let mut bytes = framed(&req);
        bytes.extend_from_slice(b"tail");
        let chunks: Vec<Result<Frame<Bytes>, Status>> = bytes
            .chunks(7)
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        let body = Body::new(http_body_util::StreamBody::new(futures::stream::iter(
            chunks,
        )));
        let first = first_message(body, MAX_CLIENT_MESSAGE_BYTES).await.unwrap();
        let decoded = crate::api::pb::ScheduleRequest::decode(first.message.clone()).unwrap();
        assert_eq!(decoded.namespace, "orders");
        let again = first.hand_on().collect().await.unwrap().to_bytes();
        assert_eq!(&again[..], &bytes[..], "every byte handed on, in order");
    }

    #[tokio::test]
    async fn a_short_an_oversized_or_a_compressed_message_is_refused() {
        let short = Body::new(http_body_util::Full::new(Bytes::from_static(&[
            0, 0, 0, 0, 9, 1,
        ])));
        let e = first_message(short, MAX_CLIENT_MESSAGE_BYTES)
            .await
            .err()
            .unwrap();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        let huge = Body::new(http_body_util::Full::new(Bytes::from_static(&[
            0, 255, 255, 255, 255,
        ])));
        let e = first_message(huge, MAX_CLIENT_MESSAGE_BYTES)
            .await
            .err()
            .unwrap();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        let packed = Body::new(http_body_util::Full::new(Bytes::from_static(&[
            1, 0, 0, 0, 0,
        ])));
        let e = first_message(packed, MAX_CLIENT_MESSAGE_BYTES)
            .await
            .err()
            .unwrap();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }
}
