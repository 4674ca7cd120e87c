//! `timerctl backup save FILE` and `timerctl backup inspect FILE`.
//!
//! `save` streams `Cluster.Backup` into `FILE.part`, checks the byte count the server announced
//! and then the file itself (row count and CRC-32, read back from disk), fsyncs it and only then
//! renames it to FILE: a FILE that exists is a whole, checked backup. `inspect` reads a backup
//! offline and says what it holds; it needs no cluster.

use std::path::{Path, PathBuf};

use crate::Ch as Channel;
use anyhow::{bail, Context};
use clap::Subcommand;
use timerdb::api::pb::{self, cluster_client::ClusterClient};
use timerdb::storage::restore::{inspect as inspect_file, BackupSummary};
use tokio::io::AsyncWriteExt;

use crate::output::{self, status_err};

#[derive(Subcommand, Debug)]
pub enum BackupCommand {
    /// Take a backup on the leader (every acknowledged write included) and save it to FILE.
    Save {
        file: PathBuf,
        /// Replace FILE if it exists.
        #[arg(long)]
        force: bool,
    },
    /// Check a backup file (row count and checksum) and show what it holds.
    Inspect { file: PathBuf },
}

/// Runs a backup command; only `save` connects to `endpoint`.
pub async fn backup(endpoint: &str, command: BackupCommand) -> anyhow::Result<()> {
    match command {
        BackupCommand::Inspect { file } => {
            let s = checked(&file)?;
            print_summary("backup", &file, &s, None);
        }
        BackupCommand::Save { file, force } => save(endpoint, &file, force).await?,
    }
    Ok(())
}

async fn save(endpoint: &str, file: &Path, force: bool) -> anyhow::Result<()> {
    if file.exists() && !force {
        bail!("{} exists; give --force to replace it", file.display());
    }
    let ch = crate::channel(endpoint).await?;
    let part = part_path(file);
    let downloaded = match download(ch, &part).await {
        Ok(info) => checked(&part).map(|summary| (info, summary)),
        Err(e) => Err(e),
    };
    let (info, summary) = match downloaded {
        Ok(got) => got,
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            return Err(e);
        }
    };
    std::fs::rename(&part, file)
        .with_context(|| format!("cannot rename {} to {}", part.display(), file.display()))?;
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    print_summary("saved backup", file, &summary, Some(info.node_id));
    Ok(())
}

/// Streams the backup into `part` (fsynced); returns what the server said of it.
async fn download(ch: Channel, part: &Path) -> anyhow::Result<pb::BackupInfo> {
    let mut stream = ClusterClient::new(ch)
        .backup(pb::BackupRequest {})
        .await
        .map_err(status_err)?
        .into_inner();
    let first = stream.message().await.map_err(status_err)?;
    let Some(info) = first.and_then(|c| c.info) else {
        bail!("the server sent no backup description");
    };
    let mut out = tokio::fs::File::create(part)
        .await
        .with_context(|| format!("cannot create {}", part.display()))?;
    let mut got = 0u64;
    while let Some(chunk) = stream.message().await.map_err(status_err)? {
        got += chunk.data.len() as u64;
        out.write_all(&chunk.data).await?;
    }
    if got != info.bytes {
        bail!(
            "the backup stream ended after {got} of {} bytes; nothing was saved",
            info.bytes
        );
    }
    out.sync_all().await?;
    Ok(info)
}

fn part_path(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".part");
    PathBuf::from(name)
}

fn checked(file: &Path) -> anyhow::Result<BackupSummary> {
    inspect_file(file).with_context(|| format!("{} is not a good backup", file.display()))
}

fn print_summary(what: &str, file: &Path, s: &BackupSummary, taken_on: Option<u64>) {
    if output::json() {
        let mut v = serde_json::to_value(s).unwrap_or_default();
        v["file"] = file.display().to_string().into();
        if let Some(node) = taken_on {
            v["node_id"] = node.into();
        }
        output::doc(v);
        return;
    }
    let on = taken_on.map_or(String::new(), |n| format!(" from node {n}"));
    println!(
        "{what} {}{on}: index {} (term {}), {} timers ({} pending), {} namespaces, {} bytes, \
         checksum ok",
        file.display(),
        s.index,
        s.term,
        s.timers,
        s.pending,
        s.namespaces,
        s.bytes
    );
    println!("replicated clock at {}", output::fmt_ms(s.cursor_ms));
}
