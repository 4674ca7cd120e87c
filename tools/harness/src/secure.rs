//! `--secure DIR`: chaos with every security feature on, so that faults meet the code paths a
//! production cluster runs (TLS handshakes on every reconnect, peer certificates checked on
//! every Raft call, keys looked up on followers that may lag).
//!
//! DIR holds the files `scripts/certs.sh DIR --client chaos-client` makes. Each node serves
//! TLS with its own certificate, requires client certificates from the client CA (mTLS), and
//! talks to its peers with mutual TLS against the cluster CA, refusing peer certificates that
//! name no member. The fault proxies work at the TCP level, so they carry TLS unchanged.
//!
//! Once a leader is up the harness, still with auth off, creates two keys and turns auth on:
//! `chaos-admin`, a certificate user (the harness's client certificate, admin), which every
//! call without a token acts as (setup, status, digests); and `chaos-worker`, a bearer token
//! allowed only to schedule, read and consume in the `chaos*` namespaces, which every worker and
//! consumer call carries. Then it checks that the lock is really shut (`verify`): plain text,
//! a TLS client without a certificate, a wrong token and the worker's token on an admin call
//! must all be refused, so a run that reports "secure" cannot have run open.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use timerdb::api::pb::{self, access_client::AccessClient, cluster_client::ClusterClient};
use timerdb_client::Connector;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

/// The name in the harness's client certificate (`scripts/certs.sh DIR --client chaos-client`).
pub const CLIENT_NAME: &str = "chaos-client";
/// What the workers' key may do: exactly the namespaces the workload uses.
const WORKER_ROLES: [&str; 3] = ["schedule:chaos*", "read:chaos*", "consume:chaos*"];

/// The certificate files of a secure run.
#[derive(Clone, Debug)]
pub struct Secure {
    dir: PathBuf,
}

impl Secure {
    /// Checks that `dir` holds what `scripts/certs.sh` makes.
    pub fn new(dir: &Path) -> anyhow::Result<Secure> {
        for f in [
            "ca.crt",
            "client-ca.crt",
            "client.crt",
            "client.key",
            "node-1.crt",
        ] {
            ensure!(
                dir.join(f).exists(),
                "{} has no {f}: make it with scripts/certs.sh {} --client {CLIENT_NAME}",
                dir.display(),
                dir.display()
            );
        }
        Ok(Secure {
            dir: dir.to_path_buf(),
        })
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `timerd`'s flags for node `id`: client TLS, required client certificates, peer mTLS
    /// with member names checked.
    pub fn node_args(&self, id: u64) -> Vec<String> {
        let cert = self.file(&format!("node-{id}.crt"));
        let key = self.file(&format!("node-{id}.key"));
        let path = |p: PathBuf| p.display().to_string();
        vec![
            "--tls-cert".into(),
            path(cert.clone()),
            "--tls-key".into(),
            path(key.clone()),
            "--client-ca".into(),
            path(self.file("client-ca.crt")),
            "--peer-ca".into(),
            path(self.file("ca.crt")),
            "--peer-cert".into(),
            path(cert),
            "--peer-key".into(),
            path(key),
            "--peer-require-member=true".into(),
        ]
    }

    fn read(&self, name: &str) -> anyhow::Result<Vec<u8>> {
        let path = self.file(name);
        std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))
    }

    /// How to reach the nodes: the cluster CA, and the harness's certificate unless
    /// `anonymous` (the client library's connector).
    pub fn connector(&self, anonymous: bool) -> anyhow::Result<Connector> {
        let ca = self.read("ca.crt")?;
        if anonymous {
            return Ok(Connector::new().tls(Some(&ca), None));
        }
        let (cert, key) = (self.read("client.crt")?, self.read("client.key")?);
        Ok(Connector::new().tls(Some(&ca), Some((&cert, &key))))
    }

    /// A TLS endpoint of `addr` with the harness's certificate.
    pub fn endpoint(&self, addr: &str) -> anyhow::Result<Endpoint> {
        Ok(self.connector(false)?.endpoint(addr)?)
    }
}

/// A client connection with its credential (the client library's).
pub use timerdb_client::Conn;

/// The bearer token a client's calls carry (none: the caller is its certificate, or anyone
/// while auth is off).
pub type Credential = timerdb_client::connect::Bearer;

fn bearer(token: &str) -> anyhow::Result<Credential> {
    Credential::new(Some(token)).map_err(anyhow::Error::msg)
}

/// Creates the admin certificate user and the workers' key, turns auth on through `admin`
/// (a channel with the harness's certificate, to any node: the calls are forwarded to the
/// leader), and returns the workers' credential.
pub async fn enable_auth(admin: Channel) -> anyhow::Result<Credential> {
    let mut access = AccessClient::new(admin);
    access
        .create_key(pb::CreateKeyRequest {
            name: "chaos-admin".into(),
            roles: vec!["admin".into()],
            cert_name: CLIENT_NAME.into(),
            no_secret: true,
        })
        .await
        .context("creating the admin certificate user")?;
    let worker = access
        .create_key(pb::CreateKeyRequest {
            name: "chaos-worker".into(),
            roles: WORKER_ROLES.iter().map(|r| r.to_string()).collect(),
            ..Default::default()
        })
        .await
        .context("creating the workers' key")?
        .into_inner();
    access
        .set_auth(pb::SetAuthRequest { enabled: true })
        .await
        .context("turning auth on")?;
    bearer(&worker.token)
}

/// Checks on node `addr` that auth and TLS are really on: every way in without the right
/// credential is refused, and the harness's certificate is admin.
pub async fn verify(secure: &Secure, addr: &str, worker: &Credential) -> anyhow::Result<()> {
    let quick = |e: Endpoint| {
        e.connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(5))
    };
    let status = |mut c: ClusterClient<Channel>| async move {
        c.status(pb::StatusRequest {}).await.map(|_| ())
    };

    // Plain text: the TLS listener does not speak it.
    let plain = quick(Connector::new().endpoint(addr)?).connect_lazy();
    if status(ClusterClient::new(plain)).await.is_ok() {
        bail!("{addr} answered a plain-text call");
    }
    // TLS without a client certificate: the handshake (or the first call) fails.
    let anonymous = quick(secure.connector(true)?.endpoint(addr)?).connect_lazy();
    if status(ClusterClient::new(anonymous)).await.is_ok() {
        bail!("{addr} answered a client without a certificate although --client-ca is set");
    }
    let admin = quick(secure.endpoint(addr)?).connect_lazy();
    wait_auth_on(&admin, addr).await?;
    // A token that is no key: refused although the certificate is good.
    let wrong = bearer("tdbk_0000000000000000_nosuchsecret")?;
    let got = ClusterClient::with_interceptor(admin.clone(), wrong)
        .status(pb::StatusRequest {})
        .await;
    expect_code(got.map(|_| ()), Code::Unauthenticated, "an unknown token")?;
    // The workers' key on an admin call.
    let got = AccessClient::with_interceptor(admin.clone(), worker.clone())
        .list_keys(pb::ListKeysRequest {})
        .await;
    expect_code(
        got.map(|_| ()),
        Code::PermissionDenied,
        "the workers' key on ListKeys",
    )?;
    // The certificate user is admin, and auth is on.
    let keys = AccessClient::new(admin)
        .list_keys(pb::ListKeysRequest {})
        .await
        .context("ListKeys as the certificate user")?
        .into_inner();
    ensure!(keys.auth_enabled, "auth is not on at {addr}");
    Ok(())
}

/// Waits until node `addr` has applied the entry that turned auth on (followers apply it a
/// little after the leader answered).
async fn wait_auth_on(admin: &Channel, addr: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let who = AccessClient::new(admin.clone())
            .who_am_i(pb::WhoAmIRequest {})
            .await;
        match who {
            Ok(w) if w.get_ref().auth_enabled => return Ok(()),
            _ if tokio::time::Instant::now() >= deadline => {
                bail!("{addr} did not turn auth on within 15 s ({who:?})")
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

fn expect_code(got: Result<(), Status>, want: Code, what: &str) -> anyhow::Result<()> {
    match got {
        Err(s) if s.code() == want => Ok(()),
        Err(s) => bail!(
            "{what}: expected {want:?}, got {:?}: {}",
            s.code(),
            s.message()
        ),
        Ok(()) => bail!("{what}: expected {want:?}, the call was allowed"),
    }
}
