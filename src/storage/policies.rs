//! Reading namespaces' configurations with their versions (docs/sharding.md §2,
//! `namespaces.rs`): group 0's, which a data group's leader copies into its own log, and a data
//! group's, which says how far its copy has come. A configuration and its version are read
//! from one snapshot of the database, so the pair is one that was applied together: a copy
//! never carries an older configuration under a newer version.

use rocksdb::{Direction, IteratorMode, ReadOptions};

use super::namespaces::version_name;
use super::store::Store;
use super::{cf, prefix_end, CF_META, CF_NAMESPACES};
use crate::keys;
use crate::namespace::{Config, Namespace};
use crate::{Error, Result};

impl Store {
    /// The version of `name`'s configuration in this group (0: none).
    pub fn policy_version(&self, name: &str) -> Result<u64> {
        let key = self.space.meta_key(&version_name(name));
        super::decode_version(self.db.get_cf(cf(&self.db, CF_META), key)?)
    }

    /// Up to `limit` configured namespaces in name order after `after`, each with its
    /// configuration's version, from one snapshot.
    pub fn versioned_namespaces(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(Namespace, u64)>> {
        let snapshot = self.db.snapshot();
        let start = match after {
            Some(a) => [self.space.namespace_key(a).as_slice(), &[0]].concat(),
            None => self.space.prefix().to_vec(),
        };
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(prefix_end(&self.space.prefix()));
        let iter = snapshot.iterator_cf_opt(
            cf(&self.db, CF_NAMESPACES),
            opts,
            IteratorMode::From(&start, Direction::Forward),
        );
        let mut out = Vec::new();
        for item in iter.take(limit) {
            let (k, v) = item?;
            let name = keys::decode_namespace_key(&k)
                .ok_or_else(|| Error::Storage("corrupt namespace name".into()))?;
            let c: Config = super::config_of(&v)?;
            let key = self.space.meta_key(&version_name(&name));
            // A row configured before its group versioned changes (a cluster of data groups
            // made by a build before 4d) counts as version 1: below every entry's index, and
            // above a data group's "none", so it is copied.
            let version = super::decode_version(snapshot.get_cf(cf(&self.db, CF_META), key)?)?;
            let version = version.max(1);
            let ns = Namespace {
                name,
                policy: c.policy,
                push: c.push,
                configured: true,
            };
            out.push((ns, version));
        }
        Ok(out)
    }
}
