//! Transport security for the client and peer ports (docs/security.md), on rustls.
//!
//! What it owns: the certificate files a node was given, the rustls configurations made from
//! them, and every TLS handshake a node takes part in as a server (its listeners) or as a
//! client of another node (the peer network, forwarding, relayed streams, elections). Push
//! connections are `push::trust`'s.
//!
//! - **Client port**: `--tls-cert`/`--tls-key` make it TLS only; `--client-ca` then demands a
//!   client certificate chaining to it (mTLS). Without `--client-ca` no client certificate is
//!   asked for.
//! - **Peer identity**: `--peer-ca`, `--peer-cert`, `--peer-key`. Nodes dial each other over
//!   TLS presenting the peer certificate and trusting only the peer CA. The `Raft` service
//!   accepts a call only over a connection whose client certificate chains to the peer CA (the
//!   auth layer asks [`Tls::check_peer`]), and with `--peer-require-member` only when one of
//!   its names is the host of a current member.
//! - **Ports**: with `--peer-listen` the peers use their own listener (presenting the peer
//!   certificate, demanding one); the client port then refuses `Raft` whatever is presented.
//!   On a shared port the one certificate serves both (the client one if given, else the peer
//!   one), so a `--tls-cert` there must chain to the peer CA for peers to accept it, and a TLS
//!   client port needs the peer settings too (peers connect to it).
//! - **Rotation**: [`Tls::reload`] (on SIGHUP) reads every file again and swaps the
//!   configurations at once: new handshakes use them, established connections go on. A file
//!   that does not load leaves the old configurations in place.
//!
//! No OpenSSL: rustls with the ring provider, TLS 1.2 and 1.3.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tonic::transport::{Channel, Endpoint};

use crate::{Error, Result};

/// The files and choices a node was given (each also a `TIMERDB_*` variable and a key of the
/// TOML `[tls]` section).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub client_ca: Option<PathBuf>,
    pub peer_ca: Option<PathBuf>,
    pub peer_cert: Option<PathBuf>,
    pub peer_key: Option<PathBuf>,
    pub peer_require_member: bool,
    /// HOST:PORT of a listener for the peers only (members are dialled at these addresses).
    pub peer_listen: Option<String>,
}

/// A node's TLS: its files and the configurations loaded from them (shared by every clone).
#[derive(Clone, Default)]
pub struct Tls {
    pub files: TlsFiles,
    loaded: Arc<RwLock<Option<Arc<Loaded>>>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.files.fmt(f)
    }
}

/// The configurations made from the files at one load.
struct Loaded {
    /// The client port's (the shared port's); `None`: plain text.
    client_port: Option<Arc<ServerConfig>>,
    /// The peer listener's (only with `peer_listen` and peer TLS).
    peer_port: Option<Arc<ServerConfig>>,
    /// For dialling other nodes; `None`: plain text.
    dial: Option<Arc<ClientConfig>>,
    /// Checks a client certificate against the peer CA alone.
    peer_verifier: Option<Arc<dyn ClientCertVerifier>>,
}

/// The peer CA of one load: checks a client certificate chain against it.
pub struct PeerCa(Arc<dyn ClientCertVerifier>);

impl PeerCa {
    /// Names this CA set (a reload makes a new one), so a verdict can be kept while it stands.
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.0) as *const () as usize
    }

    /// Whether `certs` (end entity first) chain to this CA, valid now.
    pub fn verify(
        &self,
        certs: Option<&[CertificateDer<'static>]>,
    ) -> std::result::Result<(), String> {
        let Some((end, chain)) = certs.and_then(|c| c.split_first()) else {
            return Err("no client certificate".into());
        };
        self.0
            .verify_client_cert(end, chain, UnixTime::now())
            .map(|_| ())
            .map_err(|e| format!("the certificate is not the cluster's: {e}"))
    }
}

/// Which listener a connection came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    Client,
    Peer,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn bad(flag: &str, path: &Path, why: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("{flag} {}: {why}", path.display()))
}

fn certs(flag: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path).map_err(|e| bad(flag, path, e))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad(flag, path, format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(bad(flag, path, "holds no certificate"));
    }
    Ok(certs)
}

fn key(flag: &str, path: &Path) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| bad(flag, path, format!("no private key: {e}")))
}

fn roots(sets: &[(&str, &Path)]) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for (flag, path) in sets {
        for c in certs(flag, path)? {
            roots
                .add(c)
                .map_err(|e| bad(flag, path, format!("not a CA certificate: {e}")))?;
        }
    }
    Ok(roots)
}

fn verifier(roots: RootCertStore, required: bool) -> Result<Arc<dyn ClientCertVerifier>> {
    let b = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
    let b = if required {
        b
    } else {
        b.allow_unauthenticated()
    };
    b.build()
        .map_err(|e| Error::InvalidArgument(format!("client certificate verifier: {e}")))
}

fn server(
    (cert_flag, cert): (&str, &Path),
    (key_flag, key_path): (&str, &Path),
    clients: Option<Arc<dyn ClientCertVerifier>>,
    port: Port,
) -> Result<Arc<ServerConfig>> {
    let b = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Internal(format!("TLS: {e}")))?;
    let b = match clients {
        Some(v) => b.with_client_cert_verifier(v),
        None => b.with_no_client_auth(),
    };
    let mut config = b
        .with_single_cert(certs(cert_flag, cert)?, key(key_flag, key_path)?)
        .map_err(|e| {
            bad(
                key_flag,
                key_path,
                format!("does not match the certificate: {e}"),
            )
        })?;
    // The client port also serves the HTTP/JSON API to HTTP/1.1 clients (docs/http.md).
    config.alpn_protocols = match port {
        Port::Client => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        Port::Peer => vec![b"h2".to_vec()],
    };
    Ok(Arc::new(config))
}

impl TlsFiles {
    /// Refuses combinations that cannot work, with what to do instead.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::InvalidArgument(m.to_string()));
        if self.cert.is_some() != self.key.is_some() {
            return bad("--tls-cert and --tls-key go together");
        }
        let peer = [&self.peer_ca, &self.peer_cert, &self.peer_key];
        if peer.iter().any(|p| p.is_some()) && !peer.iter().all(|p| p.is_some()) {
            return bad("--peer-ca, --peer-cert and --peer-key go together");
        }
        if self.client_ca.is_some() && self.cert.is_none() {
            return bad("--client-ca needs --tls-cert and --tls-key (client certificates are asked for over TLS)");
        }
        if self.peer_require_member && self.peer_ca.is_none() {
            return bad("--peer-require-member needs --peer-ca, --peer-cert and --peer-key");
        }
        if self.cert.is_some() && self.peer_ca.is_none() && self.peer_listen.is_none() {
            return bad(
                "a TLS client port that the peers share needs --peer-ca, --peer-cert and \
                 --peer-key (the peers connect to it too), or give the peers their own port \
                 with --peer-listen",
            );
        }
        Ok(())
    }

    fn peer_tls(&self) -> bool {
        self.peer_ca.is_some()
    }

    fn load(&self) -> Result<Loaded> {
        self.validate()?;
        let p = |o: &Option<PathBuf>| o.clone().unwrap_or_default();
        let (peer_ca, peer_cert, peer_key) =
            (p(&self.peer_ca), p(&self.peer_cert), p(&self.peer_key));
        let peer_cert_pair = (
            ("--peer-cert", peer_cert.as_path()),
            ("--peer-key", peer_key.as_path()),
        );
        let peer_verifier = match self.peer_tls() {
            true => Some(verifier(roots(&[("--peer-ca", &peer_ca)])?, true)?),
            false => None,
        };
        let shared = self.peer_listen.is_none();
        let client_port = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let mut sets = Vec::new();
                if let Some(ca) = &self.client_ca {
                    sets.push(("--client-ca", ca.as_path()));
                }
                if shared && self.peer_tls() {
                    sets.push(("--peer-ca", peer_ca.as_path()));
                }
                let clients = match sets.is_empty() {
                    true => None,
                    false => Some(verifier(roots(&sets)?, self.client_ca.is_some())?),
                };
                let pair = (("--tls-cert", cert.as_path()), ("--tls-key", key.as_path()));
                Some(server(pair.0, pair.1, clients, Port::Client)?)
            }
            // A shared port with peer TLS only: the peer certificate serves, and a client
            // certificate is optional (a peer presents one).
            _ if shared && self.peer_tls() => {
                let clients = verifier(roots(&[("--peer-ca", &peer_ca)])?, false)?;
                Some(server(
                    peer_cert_pair.0,
                    peer_cert_pair.1,
                    Some(clients),
                    Port::Client,
                )?)
            }
            _ => None,
        };
        let peer_port = match (shared, &peer_verifier) {
            (false, Some(v)) => Some(server(
                peer_cert_pair.0,
                peer_cert_pair.1,
                Some(v.clone()),
                Port::Peer,
            )?),
            _ => None,
        };
        let dial = match self.peer_tls() {
            true => {
                let mut c = ClientConfig::builder_with_provider(provider())
                    .with_safe_default_protocol_versions()
                    .map_err(|e| Error::Internal(format!("TLS: {e}")))?
                    .with_root_certificates(roots(&[("--peer-ca", &peer_ca)])?)
                    .with_client_auth_cert(
                        certs("--peer-cert", &peer_cert)?,
                        key("--peer-key", &peer_key)?,
                    )
                    .map_err(|e| {
                        bad(
                            "--peer-key",
                            &peer_key,
                            format!("does not match the certificate: {e}"),
                        )
                    })?;
                c.alpn_protocols = vec![b"h2".to_vec()];
                Some(Arc::new(c))
            }
            false => None,
        };
        Ok(Loaded {
            client_port,
            peer_port,
            dial,
            peer_verifier,
        })
    }
}

impl Tls {
    pub fn new(files: TlsFiles) -> Tls {
        Tls {
            files,
            loaded: Arc::default(),
        }
    }

    /// Reads every file and makes the configurations (at start: an error stops the node).
    pub fn load(&self) -> Result<()> {
        let loaded = self.files.load()?;
        *self.loaded.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(loaded));
        Ok(())
    }

    /// Reads every file again (SIGHUP); on an error the configurations in use stay.
    pub fn reload(&self) -> Result<()> {
        self.load()
    }

    fn current(&self) -> Option<Arc<Loaded>> {
        self.loaded
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether the peers talk over TLS (and the `Raft` service needs a peer certificate).
    pub fn peer_tls(&self) -> bool {
        self.files.peer_tls()
    }

    /// The acceptor of a listener as the files are now; `None`: plain text.
    pub fn acceptor(&self, port: Port) -> Option<tokio_rustls::TlsAcceptor> {
        let loaded = self.current()?;
        let config = match port {
            Port::Client => loaded.client_port.clone(),
            Port::Peer => loaded.peer_port.clone(),
        }?;
        Some(tokio_rustls::TlsAcceptor::from(config))
    }

    /// The peer CA as loaded now (None: this node has no peer TLS).
    pub fn peer_ca(&self) -> std::result::Result<PeerCa, String> {
        let verifier = self.current().and_then(|l| l.peer_verifier.clone());
        Ok(PeerCa(verifier.ok_or("this node has no peer CA")?))
    }

    /// With `--peer-require-member`: whether a peer certificate's `names` include the host of
    /// one of `members` (asked on every call: membership changes).
    ///
    /// A node that knows no members yet (started with `--join`, or wiped, and waiting to be
    /// added; `members` gives an empty list then, an error for a node that is not ready)
    /// accepts any certificate of the peer CA: the leader that adds it is not in any
    /// membership it has, and refusing it would leave the node unable to join for ever. It
    /// takes Raft calls only after that leader's Hello (`storage/admission.rs`), and the first
    /// entries it takes carry the membership that closes the door again.
    pub fn check_member(
        &self,
        names: &[String],
        members: impl FnOnce() -> std::result::Result<Vec<String>, String>,
    ) -> std::result::Result<(), String> {
        if !self.files.peer_require_member {
            return Ok(());
        }
        let members = members()?;
        if members.is_empty() {
            return Ok(());
        }
        let hosts: Vec<String> = members
            .iter()
            .map(|addr| host_of(addr).to_string())
            .collect();
        if !names.iter().any(|n| hosts.contains(n)) {
            return Err(format!(
                "the certificate names {names:?}, no member's host ({hosts:?})"
            ));
        }
        Ok(())
    }

    /// A channel to another node's `addr` (lazy: it connects on first use and reconnects by
    /// itself), over TLS with the peer identity when the peers use TLS; `tune` sets the
    /// endpoint's timeouts.
    pub fn channel(&self, addr: &str, tune: impl FnOnce(Endpoint) -> Endpoint) -> Result<Channel> {
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| Error::InvalidArgument(format!("bad node address {addr}: {e}")))?
            .tcp_nodelay(true);
        let endpoint = tune(endpoint);
        if crate::sim::active() {
            // The simulated network (no TLS there).
            let connector = tower::service_fn(|uri: http::Uri| async move {
                let address = uri.authority().map_or(String::new(), |a| a.to_string());
                crate::sim::connect(&address).map(hyper_util::rt::TokioIo::new)
            });
            return Ok(endpoint.connect_with_connector_lazy(connector));
        }
        if !self.peer_tls() {
            return Ok(endpoint.connect_lazy());
        }
        let tls = self.clone();
        let connector = tower::service_fn(move |uri: http::Uri| {
            let tls = tls.clone();
            async move { tls.connect(&uri).await }
        });
        Ok(endpoint.connect_with_connector_lazy(connector))
    }

    async fn connect(
        &self,
        uri: &http::Uri,
    ) -> std::io::Result<
        hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>,
    > {
        let io = |m: String| std::io::Error::other(m);
        let host = uri.host().ok_or_else(|| io(format!("no host in {uri}")))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = uri.port_u16().unwrap_or(80);
        let config = self
            .current()
            .and_then(|l| l.dial.clone())
            .ok_or_else(|| io("peer TLS is not loaded".into()))?;
        let tcp = tokio::net::TcpStream::connect((host, port)).await?;
        tcp.set_nodelay(true)?;
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| io(format!("{host} is not a server name: {e}")))?;
        let stream = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await?;
        Ok(hyper_util::rt::TokioIo::new(stream))
    }
}

/// The host of a HOST:PORT address.
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// The names a certificate is for: its subject's common names, DNS names and IP addresses.
pub fn cert_names(cert: &CertificateDer<'_>) -> Vec<String> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let Ok((_, x)) = X509Certificate::from_der(cert.as_ref()) else {
        return Vec::new();
    };
    let mut names: Vec<String> = x
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_string))
        .collect();
    if let Ok(Some(san)) = x.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                GeneralName::DNSName(d) => names.push(d.to_string()),
                GeneralName::IPAddress(ip) => match ip.len() {
                    4 => names.push(
                        std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*ip).unwrap_or_default())
                            .to_string(),
                    ),
                    16 => names.push(
                        std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*ip).unwrap_or_default())
                            .to_string(),
                    ),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    names
}
