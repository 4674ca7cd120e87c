//! `timerctl auth enable|disable|whoami` and `timerctl auth key create|revoke|list`: API keys
//! and the auth switch. Every command but `whoami` needs an admin key once auth is on.

use clap::Subcommand;
use serde_json::json;
use timerdb::api::pb::{self, access_client::AccessClient};

use crate::output::{self, status_err};
use crate::Ch as Channel;

#[derive(Subcommand, Debug)]
pub enum AuthCommand {
    /// Turn auth on: every call then needs a key (refused while no key holds `admin`).
    Enable,
    /// Turn auth off: every call works without a key again.
    Disable,
    /// Who the node takes the caller (`--token`) to be.
    Whoami,
    /// Create, revoke and list API keys.
    Key {
        #[command(subcommand)]
        command: KeyCommand,
    },
}

#[derive(Subcommand, Debug)]
pub enum KeyCommand {
    /// Create a key and print its token (shown once: only its hash is kept).
    Create {
        /// A name for people, e.g. billing-service.
        name: String,
        /// `admin`, or PERMISSION:NAMESPACE_PATTERN with PERMISSION one of schedule, read,
        /// consume, manage and a pattern that may end in '*' (`schedule:orders*`). Repeat it.
        #[arg(long = "role", required = true)]
        roles: Vec<String>,
        /// A client certificate with this CN or DNS name acts as this key (mTLS).
        #[arg(long)]
        cert_name: Option<String>,
        /// No token: the key works only through --cert-name.
        #[arg(long, requires = "cert_name")]
        no_secret: bool,
    },
    /// Revoke a key (by the id `key list` shows); every node stops accepting it.
    Revoke { id: String },
    /// List the keys (never their secrets) and whether auth is on.
    List,
}

fn key_json(k: &pb::KeyInfo) -> serde_json::Value {
    json!({
        "id": k.id, "name": k.name, "roles": k.roles, "cert_name": k.cert_name,
        "created_at_ms": k.created_at_ms, "has_secret": k.has_secret,
    })
}

fn key_line(k: &pb::KeyInfo) -> String {
    let cert = if k.cert_name.is_empty() {
        String::new()
    } else {
        format!("  cert {}", k.cert_name)
    };
    format!(
        "{}  {}  {}{cert}  created {}",
        k.id,
        k.name,
        k.roles.join(","),
        output::fmt_ms(k.created_at_ms)
    )
}

pub async fn auth(ch: Channel, command: AuthCommand) -> anyhow::Result<()> {
    let mut client = AccessClient::new(ch);
    match command {
        AuthCommand::Enable | AuthCommand::Disable => {
            let enabled = matches!(command, AuthCommand::Enable);
            let r = client
                .set_auth(pb::SetAuthRequest { enabled })
                .await
                .map_err(status_err)?
                .into_inner();
            if output::json() {
                output::doc(json!({ "auth_enabled": r.enabled }));
            } else {
                println!("auth is {}", if r.enabled { "on" } else { "off" });
            }
        }
        AuthCommand::Whoami => {
            let r = client
                .who_am_i(pb::WhoAmIRequest {})
                .await
                .map_err(status_err)?
                .into_inner();
            if output::json() {
                output::doc(json!({
                    "auth_enabled": r.auth_enabled, "principal": r.principal, "roles": r.roles,
                }));
            } else {
                println!("{} [{}]", r.principal, r.roles.join(","));
            }
        }
        AuthCommand::Key { command } => key(&mut client, command).await?,
    }
    Ok(())
}

async fn key(client: &mut AccessClient<Channel>, command: KeyCommand) -> anyhow::Result<()> {
    match command {
        KeyCommand::Create {
            name,
            roles,
            cert_name,
            no_secret,
        } => {
            let req = pb::CreateKeyRequest {
                name,
                roles,
                cert_name: cert_name.unwrap_or_default(),
                no_secret,
            };
            let r = client
                .create_key(req)
                .await
                .map_err(status_err)?
                .into_inner();
            let k = r.key.unwrap_or_default();
            if output::json() {
                output::doc(json!({ "key": key_json(&k), "token": r.token }));
            } else {
                println!("created {}", key_line(&k));
                if !r.token.is_empty() {
                    println!("token (shown once): {}", r.token);
                }
            }
        }
        KeyCommand::Revoke { id } => {
            let r = client
                .revoke_key(pb::RevokeKeyRequest { id })
                .await
                .map_err(status_err)?
                .into_inner();
            let k = r.key.unwrap_or_default();
            if output::json() {
                output::doc(json!({ "revoked": key_json(&k) }));
            } else {
                println!("revoked {}", key_line(&k));
            }
        }
        KeyCommand::List => {
            let r = client
                .list_keys(pb::ListKeysRequest {})
                .await
                .map_err(status_err)?
                .into_inner();
            if output::json() {
                let keys: Vec<_> = r.keys.iter().map(key_json).collect();
                output::doc(json!({ "auth_enabled": r.auth_enabled, "keys": keys }));
            } else {
                println!("auth is {}", if r.auth_enabled { "on" } else { "off" });
                for k in &r.keys {
                    println!("{}", key_line(k));
                }
                println!("{} key(s)", r.keys.len());
            }
        }
    }
    Ok(())
}
