//! Reaching one node: the endpoint (plain or TLS), the credential every call carries, and the
//! connection timeouts. A [`Connector`] is cheap to clone and makes lazy [`Conn`]s: nothing is
//! dialled until the first call, and a broken connection is redialled by tonic on the next.

use std::path::Path;
use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Status};

/// A channel to one node with the credential its calls carry.
pub type Conn = InterceptedService<Channel, Bearer>;

/// The `authorization: Bearer <token>` of every call (none: the caller is its certificate, or
/// anyone while auth is off).
#[derive(Clone, Default)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Bearer {
    pub fn new(token: Option<&str>) -> Result<Bearer, String> {
        match token {
            None => Ok(Bearer(None)),
            Some(t) => format!("Bearer {t}")
                .parse()
                .map(|v| Bearer(Some(v)))
                .map_err(|_| "the token holds characters a header cannot carry".into()),
        }
    }
}

impl Interceptor for Bearer {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// How to reach the nodes of a cluster.
#[derive(Clone)]
pub struct Connector {
    tls: Option<ClientTlsConfig>,
    bearer: Bearer,
    connect_timeout: Duration,
}

impl Default for Connector {
    fn default() -> Self {
        Connector {
            tls: None,
            bearer: Bearer::default(),
            connect_timeout: Duration::from_secs(3),
        }
    }
}

impl Connector {
    /// Plain text, no credential.
    pub fn new() -> Connector {
        Connector::default()
    }

    /// TLS, trusting the CA in PEM `ca` (none: the public web roots), presenting the client
    /// certificate and key in PEM `identity` if given (mTLS).
    pub fn tls(mut self, ca: Option<&[u8]>, identity: Option<(&[u8], &[u8])>) -> Connector {
        let mut tls = ClientTlsConfig::new().with_webpki_roots();
        if let Some(ca) = ca {
            tls = tls.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        self.tls = Some(tls);
        self
    }

    /// [`Connector::tls`] from PEM files (`--ca`, `--cert`, `--key` in timerctl).
    pub fn tls_files(
        self,
        ca: Option<&Path>,
        cert_and_key: Option<(&Path, &Path)>,
    ) -> Result<Connector, String> {
        let read =
            |p: &Path| std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()));
        let ca = ca.map(read).transpose()?;
        let identity = match cert_and_key {
            Some((c, k)) => Some((read(c)?, read(k)?)),
            None => None,
        };
        let identity = identity.as_ref().map(|(c, k)| (c.as_slice(), k.as_slice()));
        Ok(self.tls(ca.as_deref(), identity))
    }

    /// Sends `token` (an API key, `tdbk_…`) with every call.
    pub fn token(mut self, token: Option<&str>) -> Result<Connector, String> {
        self.bearer = Bearer::new(token)?;
        Ok(self)
    }

    pub fn connect_timeout(mut self, timeout: Duration) -> Connector {
        self.connect_timeout = timeout;
        self
    }

    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The URI of `addr` (`HOST:PORT`, or a full `http(s)://` URI) for this connector.
    pub fn uri(&self, addr: &str) -> String {
        let bare = addr
            .strip_prefix("http://")
            .or_else(|| addr.strip_prefix("https://"))
            .unwrap_or(addr);
        match self.tls.is_some() || addr.starts_with("https://") {
            true => format!("https://{bare}"),
            false => format!("http://{bare}"),
        }
    }

    /// The endpoint of `addr`, not yet connected.
    pub fn endpoint(&self, addr: &str) -> Result<Endpoint, Status> {
        let uri = self.uri(addr);
        let mut ep = Endpoint::from_shared(uri.clone())
            .map_err(|e| Status::invalid_argument(format!("{uri} is not an address: {e}")))?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true);
        if let Some(tls) = &self.tls {
            ep = ep
                .tls_config(tls.clone())
                .map_err(|e| Status::invalid_argument(format!("TLS settings: {e}")))?;
        }
        Ok(ep)
    }

    /// A connection to `addr` dialled on its first call.
    pub fn lazy(&self, addr: &str) -> Result<Conn, Status> {
        let channel = self.endpoint(addr)?.connect_lazy();
        Ok(InterceptedService::new(channel, self.bearer.clone()))
    }

    /// A connection to `addr`, dialled now (an error says why the node cannot be reached).
    pub async fn connect(&self, addr: &str) -> Result<Conn, Status> {
        let channel = self.endpoint(addr)?.connect().await.map_err(|e| {
            let mut why = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                why = format!("{why}: {s}");
                source = s.source();
            }
            Status::unavailable(format!(
                "cannot reach a timerdb node at {}: {why}",
                self.uri(addr)
            ))
        })?;
        Ok(InterceptedService::new(channel, self.bearer.clone()))
    }
}
