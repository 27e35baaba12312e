//! Callers the registry holds (docs/reference.md §12.2): its API keys,
//! policies and identity providers, taken from the worker's snapshot and
//! rebuilt whenever an access record changes, so a key created, revoked or
//! expired, or a policy edited, applies on every worker within the watch
//! stream's delay. Keys are looked up by the SHA-256 of the presented
//! secret (one hash, one map lookup); an expired key is refused at once,
//! whatever the registry has sent.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use chrono::{DateTime, Utc};
use quiver_identity::{Identities, Provider};
use quiver_model::access::{AccessKind, AccessSpec};
use quiver_model::policy::CompiledTaskPolicy;
use quiver_model::token::TokenDigest;
use quiver_sync::{AccessMap, KeyUses, SnapshotHandle};

use crate::caller::{Authenticated, CallerId, Refusal, Task, Via, oidc_caller};

/// One live API key.
struct Key {
    id: Arc<str>,
    caller: CallerId,
    policy: String,
    expires_at: Option<DateTime<Utc>>,
}

/// What one revision of the access records says.
#[derive(Default)]
struct Directory {
    /// By the SHA-256 of the secret.
    keys: HashMap<[u8; 32], Key>,
    policies: BTreeMap<String, Arc<CompiledTaskPolicy>>,
    /// The access records this was built from (to skip unchanged updates).
    built_from: AccessMap,
}

/// The registry's callers on this worker; cheap to share.
pub struct RegistryCallers {
    directory: ArcSwap<Directory>,
    identities: Identities,
    uses: KeyUses,
    /// The snapshots followed ([`Self::following`]).
    snapshot: Option<SnapshotHandle>,
    /// The snapshot revision the directory was last brought to.
    seen_revision: AtomicU64,
}

impl RegistryCallers {
    /// No callers until the first update; key uses are recorded in `uses`.
    pub fn new(uses: KeyUses) -> Self {
        RegistryCallers {
            directory: ArcSwap::from_pointee(Directory::default()),
            identities: Identities::new(Vec::new()),
            uses,
            snapshot: None,
            seen_revision: AtomicU64::new(u64::MAX),
        }
    }

    /// Follows `snapshot`: every caller is identified against the access
    /// records of the snapshot current when it asks, so a request served
    /// after a snapshot is published (a `list_changed` it caused, say)
    /// never meets the callers of an older one.
    pub fn following(mut self, snapshot: SnapshotHandle) -> Self {
        self.snapshot = Some(snapshot);
        self
    }

    /// Brings the directory to the current snapshot (one atomic read when
    /// it is there already).
    pub fn refresh(&self) {
        let Some(handle) = &self.snapshot else {
            return;
        };
        let snapshot = handle.current();
        if self.seen_revision.load(Ordering::Acquire) != snapshot.revision {
            self.update(&snapshot.access);
            self.seen_revision
                .store(snapshot.revision, Ordering::Release);
        }
    }

    fn current(&self) -> arc_swap::Guard<Arc<Directory>> {
        self.refresh();
        self.directory.load()
    }

    /// Rebuilds from the access records of a snapshot. Records the registry
    /// validated are expected to compile; one that does not (a newer
    /// registry's field, say) is left out and logged, never taken as
    /// "allow everything".
    pub fn update(&self, access: &AccessMap) {
        if self.directory.load().built_from == *access {
            return;
        }
        let mut directory = Directory {
            built_from: access.clone(),
            ..Default::default()
        };
        let mut providers = Vec::new();
        for record in access.values() {
            match &record.spec {
                AccessSpec::Policy(policy) => match policy.policy.compile() {
                    Ok(compiled) => {
                        directory
                            .policies
                            .insert(policy.name.clone(), Arc::new(compiled));
                    }
                    Err(err) => {
                        tracing::warn!(policy = %policy.name, error = %err, "registry policy left out")
                    }
                },
                AccessSpec::ApiKey(key) => {
                    let Some(digest) = digest_of_hex(&key.key_sha256) else {
                        tracing::warn!(key = %key.id, "registry API key with a malformed hash left out");
                        continue;
                    };
                    let principal: Arc<str> = format!("key:{}", key.id).into();
                    directory.keys.insert(
                        digest,
                        Key {
                            id: key.id.as_str().into(),
                            caller: CallerId::of_principal(principal),
                            policy: key.policy.clone(),
                            expires_at: key.expires_at,
                        },
                    );
                }
                AccessSpec::IdentityProvider(record) => providers.push(record.clone()),
            }
        }
        let policies = &directory.policies;
        let mut built = Vec::with_capacity(providers.len());
        for (at, record) in providers.iter().enumerate() {
            match Provider::new(at, record, |name| policies.contains_key(name)) {
                Ok(provider) => built.push(provider),
                Err(err) => {
                    tracing::warn!(provider = %record.name, error = %err, "registry identity provider left out")
                }
            }
        }
        metrics::gauge!("quiver_worker_registry_api_keys").set(directory.keys.len() as f64);
        self.identities.replace(built);
        self.directory.store(Arc::new(directory));
    }

    /// The caller of an API key's secret (already hashed): `None` when no
    /// key has it.
    pub fn key(&self, presented: &TokenDigest) -> Option<Result<Authenticated, Refusal>> {
        let directory = self.current();
        let key = directory.keys.get(presented.as_bytes())?;
        if let Some(at) = key.expires_at
            && at <= Utc::now()
        {
            return Some(Err(Refusal::Unauthenticated(format!(
                "API key {} expired at {}",
                key.id,
                at.to_rfc3339()
            ))));
        }
        let Some(policy) = directory.policies.get(&key.policy) else {
            return Some(Err(Refusal::Unauthenticated(format!(
                "API key {} names policy {:?}, which this worker does not have",
                key.id, key.policy
            ))));
        };
        self.uses.record(&key.id);
        Some(Ok(Authenticated {
            task: Task {
                name: key.policy.clone(),
                policy: policy.clone(),
            },
            id: key.caller.clone(),
            via: Via::Key,
        }))
    }

    /// The caller of a JWT of one of the registry's identity providers;
    /// `Err(None)` when no registry provider has the token's issuer.
    pub async fn jwt(&self, token: &str) -> Result<Authenticated, Option<Refusal>> {
        // The providers too are the current snapshot's.
        self.refresh();
        let verified = match self.identities.verify(token).await {
            Ok(verified) => verified,
            Err(quiver_identity::Refused::WrongIssuer) => return Err(None),
            Err(why) => {
                return Err(Some(Refusal::Unauthenticated(format!(
                    "bearer token refused: {why}"
                ))));
            }
        };
        oidc_caller(&verified, &self.current().policies).map_err(Some)
    }
}

/// The names of the policies that differ between two access maps (edited,
/// created or deleted).
pub fn changed_policies(before: &AccessMap, after: &AccessMap) -> Vec<String> {
    let policies = |map: &AccessMap| {
        map.iter()
            .filter(|((kind, _), _)| *kind == AccessKind::Policy)
            .map(|((_, name), record)| (name.clone(), record.clone()))
            .collect::<BTreeMap<_, _>>()
    };
    let (before, after) = (policies(before), policies(after));
    let mut names: Vec<String> = after
        .iter()
        .filter(|(name, record)| before.get(*name) != Some(*record))
        .map(|(name, _)| name.clone())
        .collect();
    names.extend(
        before
            .keys()
            .filter(|name| !after.contains_key(*name))
            .cloned(),
    );
    names
}

fn digest_of_hex(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut digest = [0; 32];
    for (at, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * at..2 * at + 2)?, 16).ok()?;
    }
    Some(digest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use quiver_model::Source;
    use quiver_model::access::{ApiKeyRecord, PolicyRecord, StoredAccess};
    use quiver_model::policy::TaskPolicy;

    fn stored(spec: AccessSpec) -> ((AccessKind, String), Arc<StoredAccess>) {
        (
            (spec.kind(), spec.name().to_owned()),
            Arc::new(StoredAccess {
                spec,
                revision: 1,
                created_at: Utc::now(),
                updated_at: Utc::now(),
                updated_by: "admin".into(),
                source: Source::Admin,
            }),
        )
    }

    fn key(id: &str, secret: &str, expires_at: Option<DateTime<Utc>>) -> AccessSpec {
        AccessSpec::ApiKey(ApiKeyRecord {
            id: id.into(),
            name: id.into(),
            policy: "team-a".into(),
            roles: vec![],
            expires_at,
            key_sha256: TokenDigest::of(secret).hex(),
        })
    }

    #[test]
    fn keys_follow_the_records_and_expire_on_their_own() {
        let callers = RegistryCallers::new(KeyUses::default());
        let policy = AccessSpec::Policy(PolicyRecord {
            name: "team-a".into(),
            policy: TaskPolicy::default(),
        });
        let past = Utc::now() - chrono::Duration::seconds(1);
        let access: AccessMap = [
            stored(policy),
            stored(key("k1", "qk_one", None)),
            stored(key("k2", "qk_two", Some(past))),
        ]
        .into_iter()
        .collect();
        callers.update(&access);
        let caller = callers.key(&TokenDigest::of("qk_one")).unwrap().unwrap();
        assert_eq!(caller.id.principal(), "key:k1");
        assert_eq!(
            (caller.task.name.as_str(), caller.via),
            ("team-a", Via::Key)
        );
        let expired = callers
            .key(&TokenDigest::of("qk_two"))
            .unwrap()
            .unwrap_err();
        assert!(expired.message().contains("expired"), "{expired:?}");
        assert!(callers.key(&TokenDigest::of("qk_three")).is_none());

        // Revoked: the record is gone.
        let fewer: AccessMap = access
            .into_iter()
            .filter(|((_, name), _)| name != "k1")
            .collect();
        callers.update(&fewer);
        assert!(callers.key(&TokenDigest::of("qk_one")).is_none());
        assert_eq!(changed_policies(&fewer, &AccessMap::new()), ["team-a"]);
        assert!(changed_policies(&fewer, &fewer).is_empty());
    }
}
