//! Where push may connect: the guard against server-side request forgery.
//!
//! A namespace's push target is a URL that whoever holds `manage` on the namespace chooses,
//! and the leader connects to it from inside the cluster's network. Without a guard, that key
//! could make the leader POST to the node's own ports, to a cloud metadata service
//! (169.254.169.254) or to any internal service the node can reach. So, as the Standard
//! Webhooks recommendations ask, push refuses destinations in private ranges unless the
//! operator allows them (`--push-allow-private`, for receivers on a private network):
//! loopback, RFC 1918 and unique-local, link-local (the metadata services), shared (CGNAT),
//! unspecified, broadcast and multicast addresses, IPv4-mapped IPv6 forms included.
//!
//! The check is made where it cannot be dodged: on the addresses a connection is about to
//! use. An IP literal in the URL is checked before connecting; a name is resolved by
//! [`GuardedResolver`], which drops forbidden addresses from the answer (and fails when none is
//! left), so a name that changes its answer after PutNamespace (DNS rebinding) is still
//! caught. PutNamespace also checks, to tell the operator at once ([`Guard::check_target`]).

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::dns::{GaiResolver, Name};

/// Whether push may reach private addresses.
#[derive(Clone, Copy, Debug, Default)]
pub struct Guard {
    pub allow_private: bool,
}

/// Why `ip` is not a public unicast address, if it is not.
pub fn private_kind(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_kind(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4_kind(v4),
            None => v6_kind(v6),
        },
    }
}

fn v4_kind(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_private() {
        Some("private")
    } else if ip.is_link_local() {
        Some("link-local (cloud metadata)")
    } else if a == 100 && (64..128).contains(&b) {
        Some("shared (CGNAT)")
    } else if a == 0 {
        Some("unspecified")
    } else if ip.is_broadcast() || ip.is_multicast() {
        Some("broadcast or multicast")
    } else {
        None
    }
}

fn v6_kind(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unspecified() {
        Some("unspecified")
    } else if first & 0xfe00 == 0xfc00 {
        Some("private (unique local)")
    } else if first & 0xffc0 == 0xfe80 {
        Some("link-local")
    } else if ip.is_multicast() {
        Some("multicast")
    } else {
        None
    }
}

impl Guard {
    /// The guard a node's configuration asks for (`--push-allow-private`).
    pub fn of(config: &crate::config::NodeConfig) -> Guard {
        Guard {
            allow_private: config.push_allow_private,
        }
    }

    /// Refuses `ip` unless it is public or private addresses are allowed; the message says
    /// what the operator can do.
    pub fn check_ip(&self, host: &str, ip: IpAddr) -> Result<(), String> {
        match private_kind(ip) {
            // Short enough for an attempt log's detail (128 bytes), the flag named first.
            Some(kind) if !self.allow_private => {
                let named = match host.trim_start_matches('[').trim_end_matches(']') {
                    h if h == ip.to_string() => String::new(),
                    _ => format!(" ({host})"),
                };
                Err(format!(
                    "needs --push-allow-private: {ip}{named} is a {kind} address"
                ))
            }
            _ => Ok(()),
        }
    }

    /// Checks a URL's host when it is an IP literal (names are checked when resolved).
    pub fn check_literal(&self, host: &str) -> Result<(), String> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        match bare.parse::<IpAddr>() {
            Ok(ip) => self.check_ip(host, ip),
            Err(_) => Ok(()),
        }
    }

    /// PutNamespace's check of a push target `host`: an IP literal, or a name whose every
    /// address is forbidden (a name that does not resolve yet is let through: the receiver
    /// may not be deployed yet, and each connection is checked anyway).
    pub async fn check_target(&self, host: &str, port: u16) -> Result<(), String> {
        if self.allow_private {
            return Ok(());
        }
        self.check_literal(host)?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if bare.parse::<IpAddr>().is_ok() {
            return Ok(());
        }
        let lookup = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            tokio::net::lookup_host((bare, port)),
        );
        let Ok(Ok(addrs)) = lookup.await else {
            return Ok(());
        };
        let addrs: Vec<SocketAddr> = addrs.collect();
        match addrs.iter().find(|a| self.check_ip(host, a.ip()).is_ok()) {
            Some(_) => Ok(()),
            None => match addrs.first() {
                Some(a) => self.check_ip(host, a.ip()),
                None => Ok(()),
            },
        }
    }

    /// The resolver push connections use.
    pub fn resolver(&self) -> GuardedResolver {
        GuardedResolver {
            inner: GaiResolver::new(),
            guard: *self,
        }
    }
}

/// The system resolver, with the forbidden addresses taken out of every answer.
#[derive(Clone)]
pub struct GuardedResolver {
    inner: GaiResolver,
    guard: Guard,
}

type Resolving = Pin<Box<dyn Future<Output = io::Result<std::vec::IntoIter<SocketAddr>>> + Send>>;

impl tower::Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = io::Error;
    type Future = Resolving;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, name: Name) -> Resolving {
        let resolving = self.inner.call(name.clone());
        let guard = self.guard;
        Box::pin(async move {
            let all: Vec<SocketAddr> = resolving.await?.collect();
            let mut refused = None;
            let mut allowed = Vec::with_capacity(all.len());
            for a in all {
                match guard.check_ip(name.as_str(), a.ip()) {
                    Ok(()) => allowed.push(a),
                    Err(why) => refused = Some(why),
                }
            }
            match (allowed.is_empty(), refused) {
                (true, Some(why)) => Err(io::Error::new(io::ErrorKind::PermissionDenied, why)),
                _ => Ok(allowed.into_iter()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_ranges_are_named_and_public_ones_pass() {
        let kind = |s: &str| private_kind(s.parse().unwrap());
        for (ip, want) in [
            ("127.0.0.1", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "link-local (cloud metadata)"),
            ("100.64.0.1", "shared (CGNAT)"),
            ("0.0.0.0", "unspecified"),
            ("255.255.255.255", "broadcast or multicast"),
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("fd00::1", "private (unique local)"),
            ("fe80::1", "link-local"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:169.254.169.254", "link-local (cloud metadata)"),
        ] {
            assert_eq!(kind(ip), Some(want), "{ip}");
        }
        for ip in [
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2001:4860::8888",
            "1.1.1.1",
        ] {
            assert_eq!(kind(ip), None, "{ip}");
        }
    }

    #[test]
    fn literals_are_refused_unless_allowed_and_the_message_says_how() {
        let deny = Guard::default();
        let e = deny.check_literal("127.0.0.1").unwrap_err();
        assert!(
            e.contains("loopback") && e.contains("--push-allow-private"),
            "{e}"
        );
        assert!(deny.check_literal("[::1]").is_err());
        assert!(deny.check_literal("example.com").is_ok());
        assert!(deny.check_literal("8.8.8.8").is_ok());
        let allow = Guard {
            allow_private: true,
        };
        assert!(allow.check_literal("127.0.0.1").is_ok());
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_loopback_is_refused_when_resolved() {
        let mut r = Guard::default().resolver();
        let name: Name = "localhost".parse().unwrap();
        let got = tower::Service::call(&mut r, name).await;
        let e = got.expect_err("localhost resolved to an allowed address");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("loopback"), "{e}");
        let mut open = Guard {
            allow_private: true,
        }
        .resolver();
        let name: Name = "localhost".parse().unwrap();
        assert!(tower::Service::call(&mut open, name).await.is_ok());
        let e = Guard::default()
            .check_target("localhost", 80)
            .await
            .unwrap_err();
        assert!(e.contains("localhost"), "{e}");
    }
}
