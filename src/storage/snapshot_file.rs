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
//! "TDBSNAP6"                                   magic and storage format (`storage::FORMAT`)
//! { cf: u8, key_len: u32, key, value_len: u32, value }*   cf = index in SM_CFS (before
//!                                              format 6, in `migrate::V5_CFS`)
//! 0xff, rows: u64, crc: u32                    trailer: the number of rows above, and the
//!                                              CRC-32 of every byte before `crc`
//! ```
//!
//! The trailer makes a truncated file an error rather than a smaller state machine: a reader
//! refuses a file that ends before it, whose count disagrees, or whose checksum does not match
//! (a bit flipped on a disk or in a backup kept for months). The same file is a backup
//! (`Cluster.Backup`, `timerctl backup save`), so the checksum travels with it.

use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

use crate::{Error, Result};

/// `TDBSNAP` and the storage format's digit: a file of another format is refused by its first
/// bytes.
const fn magic(format: u32) -> [u8; 8] {
    assert!(format < 10, "one digit");
    let mut m = *b"TDBSNAP0";
    m[7] = b'0' + format as u8;
    m
}
const TRAILER: u8 = 0xff;

/// The id in a snapshot file's name `snap-<id>.data`.
pub fn id_of(name: &str) -> &str {
    let name = name.strip_prefix("snap-").unwrap_or(name);
    name.strip_suffix(".data").unwrap_or(name)
}

/// The snapshot data openraft moves around: an open file that remembers its path, so install
/// can keep the very file it received instead of copying it.
pub struct SnapshotFile {
    file: Handle,
    path: PathBuf,
    /// A file being received: removed if dropped before [`SnapshotFile::finish`] (a transfer
    /// abandoned, or a snapshot openraft did not install), so none piles up until a restart.
    partial: bool,
}

impl Drop for SnapshotFile {
    fn drop(&mut self) {
        if self.partial {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The file: tokio's (its work on the blocking pool), or, in a simulation (`crate::sim`),
/// a std file read and written inline, so no work finishes at a wall-clock moment.
enum Handle {
    Tokio(tokio::fs::File),
    Inline(std::fs::File, Option<io::Result<u64>>),
}

impl Handle {
    fn of(file: std::fs::File) -> Handle {
        match crate::sim::inline() {
            true => Handle::Inline(file, None),
            false => Handle::Tokio(tokio::fs::File::from_std(file)),
        }
    }
}

impl SnapshotFile {
    /// Wraps a file already opened (for reading) at `path`.
    pub fn from_std(file: std::fs::File, path: PathBuf) -> SnapshotFile {
        SnapshotFile {
            file: Handle::of(file),
            path,
            partial: false,
        }
    }

    /// Creates (or truncates) a file to receive a snapshot into.
    pub async fn create(path: PathBuf) -> io::Result<SnapshotFile> {
        let mut options = std::fs::OpenOptions::new();
        options.read(true).write(true).create(true).truncate(true);
        let file = match crate::sim::inline() {
            true => options.open(&path)?,
            false => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || options.open(path))
                    .await
                    .map_err(io::Error::other)??
            }
        };
        Ok(SnapshotFile {
            file: Handle::of(file),
            path,
            partial: true,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The snapshot's id: its file's name without `snap-` and `.data` (see `snapshot.rs`).
    pub fn id(&self) -> String {
        let name = self.path.file_name().unwrap_or_default().to_string_lossy();
        id_of(&name).to_string()
    }

    /// The file's size, from the open handle: still right after a newer snapshot unlinked it.
    pub async fn size(&self) -> io::Result<u64> {
        match &self.file {
            Handle::Tokio(f) => Ok(f.metadata().await?.len()),
            Handle::Inline(f, _) => Ok(f.metadata()?.len()),
        }
    }

    /// Flushes and fsyncs what was written, then gives up the handle.
    pub async fn finish(mut self) -> io::Result<PathBuf> {
        use tokio::io::AsyncWriteExt;
        match &mut self.file {
            Handle::Tokio(f) => {
                f.flush().await?;
                f.sync_all().await?;
            }
            Handle::Inline(f, _) => {
                std::io::Write::flush(f)?;
                f.sync_all()?;
            }
        }
        self.partial = false;
        Ok(std::mem::take(&mut self.path))
    }
}

// Delegation to the tokio file (which is Unpin), or the std file's own calls, done at once.
impl AsyncRead for SnapshotFile {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.file {
            Handle::Tokio(f) => Pin::new(f).poll_read(cx, buf),
            Handle::Inline(f, _) => {
                let n = std::io::Read::read(f, buf.initialize_unfilled())?;
                buf.advance(n);
                Poll::Ready(Ok(()))
            }
        }
    }
}

impl AsyncWrite for SnapshotFile {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.file {
            Handle::Tokio(f) => Pin::new(f).poll_write(cx, buf),
            Handle::Inline(f, _) => Poll::Ready(std::io::Write::write(f, buf)),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.file {
            Handle::Tokio(f) => Pin::new(f).poll_flush(cx),
            Handle::Inline(f, _) => Poll::Ready(std::io::Write::flush(f)),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.file {
            Handle::Tokio(f) => Pin::new(f).poll_shutdown(cx),
            Handle::Inline(f, _) => Poll::Ready(std::io::Write::flush(f)),
        }
    }
}

impl AsyncSeek for SnapshotFile {
    fn start_seek(mut self: Pin<&mut Self>, position: io::SeekFrom) -> io::Result<()> {
        match &mut self.file {
            Handle::Tokio(f) => Pin::new(f).start_seek(position),
            Handle::Inline(f, done) => {
                *done = Some(std::io::Seek::seek(f, position));
                Ok(())
            }
        }
    }

    fn poll_complete(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        match &mut self.file {
            Handle::Tokio(f) => Pin::new(f).poll_complete(cx),
            Handle::Inline(f, done) => Poll::Ready(match done.take() {
                Some(r) => r,
                None => std::io::Seek::stream_position(f),
            }),
        }
    }
}

/// Writes rows into a new snapshot file.
pub struct RowWriter {
    out: BufWriter<std::fs::File>,
    crc: crc32fast::Hasher,
    rows: u64,
    bytes: u64,
}

impl RowWriter {
    pub fn create(path: &Path) -> Result<RowWriter> {
        Self::create_as(path, super::FORMAT)
    }

    /// A file under the magic of storage format `format`: this build writes only its own
    /// (`create`); tests write older ones, to read them.
    pub(super) fn create_as(path: &Path, format: u32) -> Result<RowWriter> {
        let out = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
        let mut w = RowWriter {
            out,
            crc: crc32fast::Hasher::new(),
            rows: 0,
            bytes: 0,
        };
        w.put(&magic(format))?;
        Ok(w)
    }

    /// Writes `bytes`, counting and checksumming them.
    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes)?;
        self.crc.update(bytes);
        self.bytes += bytes.len() as u64;
        Ok(())
    }

    pub fn row(&mut self, cf: u8, key: &[u8], value: &[u8]) -> Result<()> {
        debug_assert_ne!(cf, TRAILER);
        self.put(&[cf])?;
        for part in [key, value] {
            let len = u32::try_from(part.len())
                .map_err(|_| Error::Storage("snapshot row over 4 GiB".into()))?;
            self.put(&len.to_le_bytes())?;
            self.put(part)?;
        }
        self.rows += 1;
        Ok(())
    }

    /// Writes the trailer and fsyncs; returns (rows, bytes).
    pub fn finish(mut self) -> Result<(u64, u64)> {
        self.put(&[TRAILER])?;
        self.put(&self.rows.to_le_bytes())?;
        let crc = self.crc.clone().finalize();
        self.out.write_all(&crc.to_le_bytes())?;
        let file = self.out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok((self.rows, self.bytes + 4))
    }
}

/// Reads a snapshot file's rows in order, checking the magic and the trailer.
pub struct RowReader {
    input: BufReader<std::fs::File>,
    crc: crc32fast::Hasher,
    rows: u64,
    done: bool,
    /// Bytes of the file not read yet: a length is checked against it before allocating.
    left: u64,
    /// The storage format its magic names: before 6 its rows are format 5's (`migrate.rs`).
    format: u32,
}

/// Longest key or value a snapshot row may hold (the largest real one, the access state with
/// every key, is far below it).
const MAX_PART_BYTES: u64 = 64 * 1024 * 1024;

/// One row: (column family index in `SM_CFS`, key, value).
pub type Row = (u8, Vec<u8>, Vec<u8>);

impl RowReader {
    pub fn open(path: &Path) -> Result<RowReader> {
        let file = std::fs::File::open(path)?;
        let left = file.metadata()?.len();
        let input = BufReader::with_capacity(1 << 20, file);
        let mut r = RowReader {
            input,
            crc: crc32fast::Hasher::new(),
            rows: 0,
            done: false,
            left,
            format: 0,
        };
        let mut magic = [0u8; 8];
        r.take(&mut magic)
            .map_err(|e| corrupt(path, &e.to_string()))?;
        let readable = super::READS_FORMATS
            .iter()
            .find(|f| self::magic(**f) == magic);
        let Some(format) = readable else {
            return Err(corrupt(
                path,
                &format!(
                    "not a timerdb snapshot or backup of storage format {} (it starts {:?})",
                    super::FORMAT,
                    String::from_utf8_lossy(&magic)
                ),
            ));
        };
        r.format = *format;
        Ok(r)
    }

    /// The storage format of the file's rows (its magic's).
    pub fn format(&self) -> u32 {
        self.format
    }

    /// Reads exactly `buf.len()` bytes, checksumming them.
    fn take(&mut self, buf: &mut [u8]) -> Result<()> {
        self.input.read_exact(buf).map_err(truncated)?;
        self.crc.update(buf);
        self.left = self.left.saturating_sub(buf.len() as u64);
        Ok(())
    }

    /// The next row, or `None` after the trailer (which must end the file).
    pub fn next_row(&mut self) -> Result<Option<Row>> {
        if self.done {
            return Ok(None);
        }
        let mut cf = [0u8; 1];
        self.take(&mut cf)?;
        if cf[0] == TRAILER {
            let mut count = [0u8; 8];
            self.take(&mut count)?;
            let count = u64::from_le_bytes(count);
            if count != self.rows {
                return Err(Error::Storage(format!(
                    "snapshot trailer says {count} rows, file holds {}",
                    self.rows
                )));
            }
            let mut crc = [0u8; 4];
            self.input.read_exact(&mut crc).map_err(truncated)?;
            let (stored, computed) = (u32::from_le_bytes(crc), self.crc.clone().finalize());
            if stored != computed {
                return Err(Error::Storage(format!(
                    "snapshot checksum mismatch: the file says {stored:08x}, its bytes give \
                     {computed:08x} (the file is damaged)"
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
        self.take(&mut len)?;
        let len = u64::from(u32::from_le_bytes(len));
        if len > MAX_PART_BYTES || len > self.left {
            return Err(Error::Storage(format!(
                "snapshot row {} claims {len} bytes; {} are left in the file and a row part \
                 holds at most {MAX_PART_BYTES} (the file is damaged)",
                self.rows + 1,
                self.left
            )));
        }
        let mut buf = vec![0u8; len as usize];
        self.take(&mut buf)?;
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

        // A length claiming 4 GiB (more than the file, more than a row holds): refused
        // before anything that size is allocated.
        let mut huge = full.clone();
        let at = magic(crate::storage::FORMAT).len() + 1; // the first row's key length
        huge[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        std::fs::write(&path, &huge).unwrap();
        let e = RowReader::open(&path)
            .and_then(|mut r| r.next_row())
            .unwrap_err();
        assert!(e.to_string().contains("claims 4294967295 bytes"), "{e}");

        // One bit flipped anywhere (lengths aside, which fail on their own): refused.
        for at in 0..full.len() {
            let mut damaged = full.clone();
            damaged[at] ^= 0x10;
            std::fs::write(&path, &damaged).unwrap();
            let outcome = RowReader::open(&path).and_then(|mut r| {
                while r.next_row()?.is_some() {}
                Ok(())
            });
            assert!(outcome.is_err(), "flip at {at} read as valid");
        }
    }

    #[test]
    fn a_file_of_another_storage_format_is_refused_by_its_magic() {
        assert_eq!(&magic(5), b"TDBSNAP5");
        // Format 4 (before recurring timers) is a subset of 5: its files are read.
        let dir4 = tempfile::TempDir::new().unwrap();
        let path4 = dir4.path().join("four");
        let mut w = RowWriter::create(&path4).unwrap();
        w.row(0, b"k", b"v").unwrap();
        w.finish().unwrap();
        let mut bytes = std::fs::read(&path4).unwrap();
        bytes[..8].copy_from_slice(b"TDBSNAP4");
        std::fs::write(&path4, &bytes).unwrap();
        assert!(
            RowReader::open(&path4).is_ok(),
            "a format-4 file was refused"
        );
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("old");
        let mut w = RowWriter::create(&path).unwrap();
        w.row(0, b"k", b"v").unwrap();
        w.finish().unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[..8].copy_from_slice(b"TDBSNAP3");
        std::fs::write(&path, &bytes).unwrap();
        let err = RowReader::open(&path).err().map(|e| e.to_string());
        let err = err.expect("a format 3 file was opened");
        assert!(
            err.contains(&format!("storage format {}", super::super::FORMAT))
                && err.contains("TDBSNAP3"),
            "{err}"
        );
    }
}
