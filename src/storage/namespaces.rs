//! Applying the namespace commands: PutNamespace and its later forms (SetNamespace,
//! ConfigureNamespace: the misfire policy too, the secrets kept as they are when it applies)
//! and PauseNamespace — and `Policy`, a data group's copy of a namespace's configuration
//! (docs/sharding.md §2). A namespace's configuration is one row of the `namespaces` family; the
//! entry's staged copy answers the entry's later commands.
//!
//! In a cluster of data groups, a namespace's configuration also has a **version** (a record
//! `G policy_version/<name>` in `meta`): in group 0, the log index of the entry that last
//! changed it; in a data group, the version of the group-0 configuration its copy is. A
//! `Policy` older than (or as old as) the copy changes nothing, so copies proposed twice, or
//! out of order by two leaders, leave the newest. A cluster of one group writes no versions.

use super::apply::Applier;
use super::{cf, CF_META, CF_NAMESPACES};
use crate::command::Response;
use crate::namespace::{Config, Namespace, Policy, PushTarget};
use crate::Result;

/// The name of a namespace's version record in `meta` (see the module essay).
pub(super) fn version_name(namespace: &str) -> Vec<u8> {
    [b"policy_version/".as_slice(), namespace.as_bytes()].concat()
}

impl Applier<'_> {
    /// A change of a namespace's configuration by group 0's own commands: versioned by this
    /// entry's index in a cluster of data groups.
    pub(super) fn change_namespace(&mut self, name: String, config: Config) -> Response {
        if self.sharded {
            self.set_version(&name, self.index);
        }
        self.put_namespace(name, config)
    }

    fn set_version(&mut self, name: &str, version: u64) {
        self.policy_versions.insert(name.to_string(), version);
        let key = self.space.meta_key(&version_name(name));
        (self.batch).put_cf(cf(self.db, CF_META), key, version.to_be_bytes());
    }

    /// The version of `name`'s configuration here (0: none).
    fn version(&self, name: &str) -> Result<u64> {
        if let Some(v) = self.policy_versions.get(name) {
            return Ok(*v);
        }
        let key = self.space.meta_key(&version_name(name));
        super::decode_version(self.db.get_cf(cf(self.db, CF_META), key)?)
    }

    /// A `Policy`: the copy of group 0's configuration at `version`, if newer than this
    /// group's.
    pub(super) fn copy_policy(
        &mut self,
        name: String,
        version: u64,
        mut config: Config,
        misfire: crate::namespace::Misfire,
    ) -> Result<Response> {
        if version <= self.version(&name)? {
            return Ok(Response::None);
        }
        config.policy.misfire = misfire;
        self.set_version(&name, version);
        Ok(self.put_namespace(name, config))
    }

    /// Replaces a namespace's configuration row (and the entry's staged copy).
    pub(super) fn put_namespace(&mut self, name: String, config: Config) -> Response {
        self.namespaces_changed = true;
        self.policies.insert(name.clone(), config.policy);
        self.pushes.insert(name.clone(), config.push.clone());
        let key = self.space.namespace_key(&name);
        self.batch.put_cf(
            cf(self.db, CF_NAMESPACES),
            key,
            super::config_bytes(&config),
        );
        Response::Namespace(Namespace {
            name,
            policy: config.policy,
            push: config.push,
            configured: true,
        })
    }

    /// A PutNamespace: `policy` and `push` replace the namespace's, except for what it keeps
    /// of the namespace as it is now (see `Command::ConfigureNamespace`).
    pub(super) fn configure_namespace(
        &mut self,
        name: String,
        mut policy: Policy,
        mut push: Option<PushTarget>,
        misfire: crate::namespace::Misfire,
        keep_secrets: bool,
    ) -> Result<Response> {
        let (current, _) = self.config(&name)?;
        policy.misfire = misfire;
        policy.paused = current.policy.paused;
        if let (Some(target), Some(old), true) = (push.as_mut(), current.push, keep_secrets) {
            target.secrets = old.secrets;
        }
        Ok(self.change_namespace(name, Config { policy, push }))
    }

    /// Sets a namespace's paused flag, keeping the rest of its configuration (a namespace
    /// never configured gets the defaults).
    pub(super) fn pause_namespace(&mut self, name: String, paused: bool) -> Result<Response> {
        let (mut config, _) = self.config(&name)?;
        config.policy.paused = paused;
        Ok(self.change_namespace(name, config))
    }
}
