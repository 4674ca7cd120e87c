//! The web console (docs/console.md): a page and its script and style, compiled into the
//! binary (no CDN, nothing to install), served at `/console/` on the client port. Everything it
//! shows it reads from the HTTP/JSON API with the credential the user gives it, so it can see
//! and do exactly what that key may; it hides what would be refused, the server refuses it.

use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode};
use tonic::body::Body;

const INDEX: &str = include_str!("console/index.html");
const APP: &str = include_str!("console/app.js");
const STYLE: &str = include_str!("console/style.css");

/// The answer for a console path, or `None` for a path that is not the console's.
pub fn serve(method: &Method, path: &str) -> Option<http::Response<Body>> {
    let (body, kind) = match path {
        "/" => return Some(redirect("/console/")),
        "/console" => return Some(redirect("/console/")),
        "/console/" | "/console/index.html" => (INDEX, "text/html; charset=utf-8"),
        "/console/app.js" => (APP, "text/javascript; charset=utf-8"),
        "/console/style.css" => (STYLE, "text/css; charset=utf-8"),
        _ => return None,
    };
    if method != Method::GET && method != Method::HEAD {
        let mut r = http::Response::new(Body::empty());
        *r.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        r.headers_mut()
            .insert(http::header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Some(r);
    }
    let mut r = http::Response::new(Body::new(http_body_util::Full::new(Bytes::from_static(
        body.as_bytes(),
    ))));
    let h = r.headers_mut();
    h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    // Only this origin's script, style and API: nothing injected runs, nothing is framed.
    h.insert(
        http::header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        ),
    );
    h.insert(
        http::header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        http::header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    Some(r)
}

fn redirect(to: &'static str) -> http::Response<Body> {
    let mut r = http::Response::new(Body::empty());
    *r.status_mut() = StatusCode::FOUND;
    r.headers_mut()
        .insert(http::header::LOCATION, HeaderValue::from_static(to));
    r
}
