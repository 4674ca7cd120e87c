//! The Backup stream: a snapshot file sent in order, in bounded chunks, from the leader.
//!
//! The leader reads the file it was handed (`Node::backup`) one chunk at a time, so a backup of
//! any size costs one buffer and the channel's few chunks. A follower relays the leader's stream
//! unchanged (one hop, like every forwarded call). The first message says what the backup holds
//! and how many bytes follow; the client checks the count and the file's own checksum.

use std::pin::Pin;

use futures::Stream;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::api::pb;
use crate::raft_types::NodeId;
use crate::storage::Snapshot;

/// Bytes per data message.
const CHUNK_BYTES: usize = 1 << 20;

/// The stream a Backup returns.
pub type BackupStream = Pin<Box<dyn Stream<Item = Result<pb::BackupChunk, Status>> + Send>>;

/// Streams `snap` (already open, so a newer snapshot cannot remove it from under us).
pub fn stream(node_id: NodeId, snap: Snapshot) -> BackupStream {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        if let Err(e) = send(node_id, snap, &tx).await {
            tracing::warn!(error = %e, "backup stream failed");
            let _ = tx
                .send(Err(Status::internal(format!("reading the backup: {e}"))))
                .await;
        }
    });
    Box::pin(ReceiverStream::new(rx))
}

async fn send(
    node_id: NodeId,
    snap: Snapshot,
    tx: &mpsc::Sender<Result<pb::BackupChunk, Status>>,
) -> std::io::Result<()> {
    let mut file = snap.snapshot;
    let bytes = file.size().await?;
    let log_id = snap.meta.last_log_id;
    let info = pb::BackupInfo {
        index: log_id.map_or(0, |l| l.index),
        term: log_id.map_or(0, |l| l.leader_id.term),
        bytes,
        node_id,
        snapshot_id: file.id(),
    };
    let first = pb::BackupChunk {
        info: Some(info),
        data: Vec::new(),
    };
    if tx.send(Ok(first)).await.is_err() {
        return Ok(()); // the client went away
    }
    let mut sent = 0u64;
    loop {
        let mut buf = vec![0u8; CHUNK_BYTES];
        let n = file.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        buf.truncate(n);
        sent += n as u64;
        let chunk = pb::BackupChunk {
            info: None,
            data: buf,
        };
        if tx.send(Ok(chunk)).await.is_err() {
            return Ok(());
        }
    }
    if sent != bytes {
        return Err(std::io::Error::other(format!(
            "sent {sent} bytes of a {bytes}-byte file"
        )));
    }
    tracing::info!(bytes, index = log_id.map_or(0, |l| l.index), "backup sent");
    Ok(())
}
