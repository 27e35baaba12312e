//! Who may call (docs/reference.md §12.2): policies, API keys and identity
//! providers as revisioned records, written through the store like server
//! records (audited here) and read from the in-memory head; API keys'
//! secrets and the lookup of a key by its secret. The admin API's handlers
//! are `rest::access`.
//!
//! An API key's secret is made here, returned once in the creation
//! response and stored only as its SHA-256; no read, log or history shows
//! it.

use base64::Engine as _;
use chrono::Utc;
use quiver_model::Source;
use quiver_model::access::{AccessKind, AccessSpec, ApiKeyRecord};
use quiver_model::token::TokenDigest;
use quiver_store::{AccessDelete, AccessOutcome, AccessPut, Store};

use crate::auth::Role as AuthRole;
use crate::error::RegistryError;
use crate::head::HeadView;

/// The prefix of every API key secret, so a leaked one is recognisable
/// (secret scanners) and never mistaken for a JWT.
pub const KEY_PREFIX: &str = "qk_";

/// The registry role and principal (`key:<id>`) of an API key secret, if
/// it is a live key with roles. A key holding several roles acts with the
/// most powerful: admin, then editor, approver, viewer.
pub(crate) fn key_role(head: &HeadView, token: &str) -> Option<(AuthRole, String)> {
    let key = live_key(head, token)?;
    let role = crate::signin::strongest(&key.roles)?;
    Some((role, format!("key:{}", key.id)))
}

/// The API key whose secret `token` is, if it has not expired, whatever
/// its roles.
pub(crate) fn live_key<'a>(head: &'a HeadView, token: &str) -> Option<&'a ApiKeyRecord> {
    if !token.starts_with(KEY_PREFIX) {
        return None;
    }
    let digest = TokenDigest::of(token).hex();
    let now = Utc::now();
    head.access_of(AccessKind::ApiKey)
        .find_map(|record| match &record.spec {
            AccessSpec::ApiKey(key) if key.key_sha256 == digest && !key.expired_at(now) => {
                Some(key)
            }
            _ => None,
        })
}

/// Writes an access record as `actor` (an admin-API write), auditing it
/// unless nothing changed; the store's outcome says which.
pub async fn put(
    store: &dyn Store,
    spec: AccessSpec,
    expected_revision: Option<u64>,
    actor: String,
) -> Result<AccessOutcome, RegistryError> {
    let outcome = store
        .put_access(AccessPut {
            spec,
            expected_revision,
            actor,
            source: Source::Admin,
        })
        .await?;
    if !matches!(outcome, AccessOutcome::Unchanged(_)) {
        let record = outcome.record();
        audit(
            "access_upsert",
            record.spec.kind(),
            record.spec.name(),
            record.revision,
            &record.updated_by,
        );
    }
    Ok(outcome)
}

/// Deletes an access record as `actor`, audited; the revision of the
/// delete.
pub async fn delete(
    store: &dyn Store,
    kind: AccessKind,
    name: String,
    expected_revision: Option<u64>,
    actor: String,
) -> Result<u64, RegistryError> {
    let revision = store
        .delete_access(AccessDelete {
            kind,
            name: name.clone(),
            expected_revision,
            actor: actor.clone(),
            source: Source::Admin,
        })
        .await?;
    audit("access_delete", kind, &name, revision, &actor);
    Ok(revision)
}

fn audit(action: &'static str, kind: AccessKind, name: &str, revision: u64, actor: &str) {
    metrics::counter!("quiver_registry_access_changes_total", "kind" => kind.as_str()).increment(1);
    tracing::info!(
        target: "quiver::audit",
        action,
        kind = kind.as_str(),
        name,
        revision,
        actor,
        "registry change"
    );
}

/// A new key's id and secret: 8 and 32 random bytes.
pub(crate) fn new_key() -> (String, String) {
    let id: [u8; 8] = rand::random();
    let secret: [u8; 32] = rand::random();
    let id = hex::encode(id);
    let key = format!(
        "{KEY_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret)
    );
    (id, key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_random_prefixed_and_stored_as_their_digest() {
        let (id, key) = new_key();
        let (other_id, other_key) = new_key();
        assert_eq!(id.len(), 16);
        assert!(key.starts_with(KEY_PREFIX));
        assert_eq!(key.len(), KEY_PREFIX.len() + 43);
        assert_ne!(id, other_id);
        assert_ne!(key, other_key);
        assert_eq!(TokenDigest::of(&key).hex().len(), 64);
    }
}
