//! A snapshot's bytes: the file format and the file handle openraft streams.
//!
//! A snapshot is a file, written once and never held whole in memory: the builder streams rows
//! from a RocksDB snapshot into it, openraft reads it in chunks (`snapshot_max_chunk_size`) to
//! send it, a receiver writes the chunks into a new file at their offsets, and install streams
//! the rows back out. Memory stays at one buffer whatever the number of timers.
//!
//! Format (all integers little-endian):
//!
//! ```text
//! "TDBSNAP1"                                   magic and version
//! { cf: u8, key_len: u32, key, value_len: u32, value }*   cf = index in SM_CFS
//! 0xff, rows: u64                              trailer: the number of rows above
//! ```
//!
//! The trailer makes a truncated file an error rather than a smaller state machine: a reader
//! refuses a file that ends before it, or whose count disagrees.

use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

use crate::{Error, Result};

const MAGIC: &[u8; 8] = b"TDBSNAP1";
const TRAILER: u8 = 0xff;

/// The snapshot data openraft moves around: an open file that remembers its path, so install
/// can keep the very file it received instead of copying it.
pub struct SnapshotFile {
    file: tokio::fs::File,
    path: PathBuf,
}

impl SnapshotFile {
    /// Wraps a file already opened (for reading) at `path`.
    pub fn from_std(file: std::fs::File, path: PathBuf) -> SnapshotFile {
        SnapshotFile {
            file: tokio::fs::File::from_std(file),
            path,
        }
    }

    /// Creates (or truncates) a file to receive a snapshot into.
    pub async fn create(path: PathBuf) -> io::Result<SnapshotFile> {
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .await?;
        Ok(SnapshotFile { file, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Flushes and fsyncs what was written, then gives up the handle.
    pub async fn finish(mut self) -> io::Result<PathBuf> {
        use tokio::io::AsyncWriteExt;
        self.file.flush().await?;
        self.file.sync_all().await?;
        Ok(self.path)
    }
}

// Plain delegation to the tokio file (which is Unpin).
impl AsyncRead for SnapshotFile {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_read(cx, buf)
    }
}

impl AsyncWrite for SnapshotFile {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.file).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_shutdown(cx)
    }
}

impl AsyncSeek for SnapshotFile {
    fn start_seek(mut self: Pin<&mut Self>, position: io::SeekFrom) -> io::Result<()> {
        Pin::new(&mut self.file).start_seek(position)
    }

    fn poll_complete(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        Pin::new(&mut self.file).poll_complete(cx)
    }
}

/// Writes rows into a new snapshot file.
pub struct RowWriter {
    out: BufWriter<std::fs::File>,
    rows: u64,
    bytes: u64,
}

impl RowWriter {
    pub fn create(path: &Path) -> Result<RowWriter> {
        let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
        out.write_all(MAGIC)?;
        Ok(RowWriter {
            out,
            rows: 0,
            bytes: MAGIC.len() as u64,
        })
    }

    pub fn row(&mut self, cf: u8, key: &[u8], value: &[u8]) -> Result<()> {
        debug_assert_ne!(cf, TRAILER);
        self.out.write_all(&[cf])?;
        for part in [key, value] {
            let len = u32::try_from(part.len())
                .map_err(|_| Error::Storage("snapshot row over 4 GiB".into()))?;
            self.out.write_all(&len.to_le_bytes())?;
            self.out.write_all(part)?;
        }
        self.rows += 1;
        self.bytes += 9 + key.len() as u64 + value.len() as u64;
        Ok(())
    }

    /// Writes the trailer and fsyncs; returns (rows, bytes).
    pub fn finish(mut self) -> Result<(u64, u64)> {
        self.out.write_all(&[TRAILER])?;
        self.out.write_all(&self.rows.to_le_bytes())?;
        let file = self.out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok((self.rows, self.bytes + 9))
    }
}

/// Reads a snapshot file's rows in order, checking the magic and the trailer.
pub struct RowReader {
    input: BufReader<std::fs::File>,
    rows: u64,
    done: bool,
}

/// One row: (column family index in `SM_CFS`, key, value).
pub type Row = (u8, Vec<u8>, Vec<u8>);

impl RowReader {
    pub fn open(path: &Path) -> Result<RowReader> {
        let mut input = BufReader::with_capacity(1 << 20, std::fs::File::open(path)?);
        let mut magic = [0u8; 8];
        input
            .read_exact(&mut magic)
            .map_err(|e| corrupt(path, &e.to_string()))?;
        if &magic != MAGIC {
            return Err(corrupt(path, "not a timerdb snapshot (bad magic)"));
        }
        Ok(RowReader {
            input,
            rows: 0,
            done: false,
        })
    }

    /// The next row, or `None` after the trailer (which must end the file).
    pub fn next_row(&mut self) -> Result<Option<Row>> {
        if self.done {
            return Ok(None);
        }
        let mut cf = [0u8; 1];
        self.input.read_exact(&mut cf).map_err(truncated)?;
        if cf[0] == TRAILER {
            let mut count = [0u8; 8];
            self.input.read_exact(&mut count).map_err(truncated)?;
            let count = u64::from_le_bytes(count);
            if count != self.rows {
                return Err(Error::Storage(format!(
                    "snapshot trailer says {count} rows, file holds {}",
                    self.rows
                )));
            }
            if !self.input.fill_buf()?.is_empty() {
                return Err(Error::Storage(
                    "snapshot has bytes after its trailer".into(),
                ));
            }
            self.done = true;
            return Ok(None);
        }
        let key = self.part()?;
        let value = self.part()?;
        self.rows += 1;
        Ok(Some((cf[0], key, value)))
    }

    fn part(&mut self) -> Result<Vec<u8>> {
        let mut len = [0u8; 4];
        self.input.read_exact(&mut len).map_err(truncated)?;
        let mut buf = vec![0u8; u32::from_le_bytes(len) as usize];
        self.input.read_exact(&mut buf).map_err(truncated)?;
        Ok(buf)
    }
}

fn truncated(e: io::Error) -> Error {
    Error::Storage(format!("snapshot file ends early: {e}"))
}

fn corrupt(path: &Path, why: &str) -> Error {
    Error::Storage(format!("snapshot {}: {why}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_and_truncation_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.data");
        let mut w = RowWriter::create(&path).unwrap();
        w.row(0, b"k1", b"v1").unwrap();
        w.row(4, b"k2", b"").unwrap();
        let (rows, bytes) = w.finish().unwrap();
        assert_eq!(rows, 2);
        assert_eq!(bytes, std::fs::metadata(&path).unwrap().len());

        let mut r = RowReader::open(&path).unwrap();
        assert_eq!(
            r.next_row().unwrap(),
            Some((0, b"k1".to_vec(), b"v1".to_vec()))
        );
        assert_eq!(r.next_row().unwrap(), Some((4, b"k2".to_vec(), vec![])));
        assert_eq!(r.next_row().unwrap(), None);

        // Cut anywhere before the end: never read as a shorter, valid snapshot.
        let full = std::fs::read(&path).unwrap();
        for cut in 0..full.len() {
            std::fs::write(&path, &full[..cut]).unwrap();
            let outcome = RowReader::open(&path).and_then(|mut r| {
                while r.next_row()?.is_some() {}
                Ok(())
            });
            assert!(outcome.is_err(), "cut at {cut} read as valid");
        }
    }
}
