//! Applying the namespace commands: PutNamespace and its later forms (SetNamespace,
//! ConfigureNamespace: the misfire policy too, the secrets kept as they are when it applies)
//! and PauseNamespace. A namespace's configuration is one row of the `namespaces` family; the
//! entry's staged copy answers the entry's later commands.

use super::apply::Applier;
use super::{cf, CF_NAMESPACES};
use crate::command::Response;
use crate::namespace::{Config, Namespace, Policy, PushTarget};
use crate::Result;

impl Applier<'_> {
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
        Ok(self.put_namespace(name, Config { policy, push }))
    }

    /// Sets a namespace's paused flag, keeping the rest of its configuration (a namespace
    /// never configured gets the defaults).
    pub(super) fn pause_namespace(&mut self, name: String, paused: bool) -> Result<Response> {
        let (mut config, _) = self.config(&name)?;
        config.policy.paused = paused;
        Ok(self.put_namespace(name, config))
    }
}
