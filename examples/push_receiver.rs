//! A push receiver in Rust: verifies each request's Standard Webhooks signature, prints the
//! timer and answers 204 (ACKED); a bad signature or an old timestamp gets 401 (retried).
//!
//! `cargo run --example push_receiver -- 127.0.0.1:8080 whsec_...` (see README, "Push delivery").
//! It uses only hyper, hmac, sha2 and base64 (no timerdb code), as a service of yours would.

use base64::{engine::general_purpose::STANDARD, Engine};
use hmac::{Hmac, Mac};
use http_body_util::{BodyExt, Full};
use hyper::{body::Incoming, Request, Response};

/// Whether `sigs` (the `webhook-signature` header: `v1,<base64>` entries, two while the
/// namespace rotates its secret) holds a valid HMAC-SHA256 of `{id}.{ts}.{body}`.
fn verify(key: &[u8], id: &str, ts: &str, body: &[u8], sigs: &str) -> bool {
    let sigs = sigs.split(' ').filter_map(|s| s.strip_prefix("v1,"));
    sigs.filter_map(|s| STANDARD.decode(s).ok()).any(|sig| {
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
        mac.update(format!("{id}.{ts}.").as_bytes());
        mac.update(body);
        mac.verify_slice(&sig).is_ok() // constant time
    })
}

async fn handle(
    key: Vec<u8>,
    req: Request<Incoming>,
) -> Result<Response<Full<&'static [u8]>>, hyper::Error> {
    let h = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let (id, ts, sigs) = (
        h("webhook-id"),
        h("webhook-timestamp"),
        h("webhook-signature"),
    );
    let (ns, timer, attempt) = (
        h("timerdb-namespace"),
        h("timerdb-id"),
        h("timerdb-attempt"),
    );
    let body = req.into_body().collect().await?.to_bytes();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let fresh = ts.parse::<i64>().is_ok_and(|t| (now - t).abs() <= 300);
    let status = if fresh && verify(&key, &id, &ts, &body, &sigs) {
        // Deduplicate by `id` (the webhook-id): it is the same on every attempt of one firing.
        println!(
            "{ns}/{timer} attempt {attempt} ({id}): {}",
            String::from_utf8_lossy(&body)
        );
        204
    } else {
        eprintln!("refused {ns}/{timer}: bad signature or timestamp");
        401
    };
    Ok(Response::builder()
        .status(status)
        .body(Full::new(&b""[..]))
        .unwrap())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:8080".into());
    let secret = args.next().expect("usage: push_receiver ADDR whsec_SECRET");
    let key = STANDARD.decode(secret.trim_start_matches("whsec_"))?;
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("receiving on http://{addr}/");
    loop {
        let (stream, _) = listener.accept().await?;
        let key = key.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| handle(key.clone(), req));
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, svc)
                .await;
        });
    }
}
