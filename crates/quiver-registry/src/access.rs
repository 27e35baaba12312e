//! The REST admin API of who may call (docs/reference.md §12.2): policies,
//! API keys and identity providers as revisioned records, written through
//! the store like server records and read from the in-memory head.
//!
//! An API key's secret is made here, returned once in the creation
//! response and stored only as its SHA-256; no read, log or history shows
//! it.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use base64::Engine as _;
use chrono::{DateTime, Utc};
use quiver_model::Source;
use quiver_model::access::{
    AccessKind, AccessSpec, ApiKeyRecord, IdentityProviderRecord, PolicyRecord, Role, StoredAccess,
};
use quiver_model::policy::TaskPolicy;
use quiver_model::token::TokenDigest;
use quiver_store::{AccessDelete, AccessOutcome, AccessPut};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::Role as AuthRole;
use crate::error::{RegistryError, parse_json};
use crate::head::HeadView;
use crate::rest::{
    Caller, Params, RequireAdmin, RequireEditor, RequireViewer, expected_revision, with_etag,
};
use crate::state::RegistryState;

/// The prefix of every API key secret, so a leaked one is recognisable
/// (secret scanners) and never mistaken for a JWT.
pub const KEY_PREFIX: &str = "qk_";

/// Routes of who may call, merged into the admin API at `/admin/api`.
pub fn router() -> Router<RegistryState> {
    let (policies, policy) = reads(AccessKind::Policy);
    let (keys, key) = reads(AccessKind::ApiKey);
    let (providers, provider) = reads(AccessKind::IdentityProvider);
    Router::new()
        .route("/policies", policies)
        .route(
            "/policies/{name}",
            policy.put(put_policy).delete(delete_policy),
        )
        .route("/policies/{name}/history", get(policy_history))
        .route("/access/explain", post(crate::explain::explain_route))
        .route("/keys", keys.post(create_key))
        .route("/keys/{id}", key.delete(admin_delete(AccessKind::ApiKey)))
        .route("/identity/providers", providers)
        .route(
            "/identity/providers/{name}",
            provider
                .put(put_provider)
                .delete(admin_delete(AccessKind::IdentityProvider)),
        )
}

/// The reads of one kind (viewer, editor or admin): its list, and one
/// record by name.
fn reads(kind: AccessKind) -> (MethodRouter<RegistryState>, MethodRouter<RegistryState>) {
    let list = get(
        move |_: RequireViewer, State(state): State<RegistryState>| async move {
            list_of(&state, kind).await
        },
    );
    let one = get(
        move |_: RequireViewer, State(state): State<RegistryState>, Path(name): Path<String>| async move {
            get_one(&state, kind, &name).await
        },
    );
    (list, one)
}

/// The delete of a kind only the admin writes (keys: a revocation;
/// identity providers).
fn admin_delete(kind: AccessKind) -> MethodRouter<RegistryState> {
    axum::routing::delete(
        move |RequireAdmin(caller): RequireAdmin,
              State(state): State<RegistryState>,
              Path(name): Path<String>,
              Params(query): Params,
              headers: HeaderMap| async move {
            let expected = expected_revision(&query, &headers)?;
            delete(&state, caller, kind, name, expected).await
        },
    )
}

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

/// A record as reads show it: its content (a key without its hash) and
/// what the registry knows of it.
fn present(record: &StoredAccess, last_used: Option<DateTime<Utc>>) -> Value {
    let mut body = match &record.spec {
        AccessSpec::Policy(policy) => json!({"name": policy.name, "policy": policy.policy}),
        AccessSpec::ApiKey(key) => json!({
            "id": key.id,
            "name": key.name,
            "policy": key.policy,
            "roles": key.roles,
            "expires_at": key.expires_at,
            "last_used_at": last_used,
        }),
        AccessSpec::IdentityProvider(provider) => json!(provider),
    };
    body["revision"] = json!(record.revision);
    body["created_at"] = json!(record.created_at);
    body["updated_at"] = json!(record.updated_at);
    body["updated_by"] = json!(record.updated_by);
    body["source"] = json!(record.source.to_string());
    body
}

async fn list_of(state: &RegistryState, kind: AccessKind) -> Result<Response, RegistryError> {
    let head = state.feed.head().await?;
    let last_used = match kind {
        AccessKind::ApiKey => state.store.api_keys_last_used().await?,
        _ => Default::default(),
    };
    let items: Vec<Value> = head
        .access_of(kind)
        .map(|record| present(record, last_used.get(record.spec.name()).copied()))
        .collect();
    let field = match kind {
        AccessKind::Policy => "policies",
        AccessKind::ApiKey => "keys",
        AccessKind::IdentityProvider => "providers",
    };
    Ok(axum::Json(json!({"revision": head.revision, field: items})).into_response())
}

async fn get_one(
    state: &RegistryState,
    kind: AccessKind,
    name: &str,
) -> Result<Response, RegistryError> {
    let head = state.feed.head().await?;
    let record = head
        .access_record(kind, name)
        .ok_or_else(|| RegistryError::NotFound(format!("{kind} {name:?} not found")))?;
    let last_used = match kind {
        AccessKind::ApiKey => state.store.api_keys_last_used().await?.remove(name),
        _ => None,
    };
    Ok(with_etag(
        StatusCode::OK,
        record.revision,
        present(record, last_used),
    ))
}

/// Writes a record with audit logging; 201 when created.
async fn put(
    state: &RegistryState,
    caller: Caller,
    spec: AccessSpec,
    expected_revision: Option<u64>,
) -> Result<(StatusCode, Arc<StoredAccess>), RegistryError> {
    let outcome = state
        .store
        .put_access(AccessPut {
            spec,
            expected_revision,
            actor: caller.actor,
            source: Source::Admin,
        })
        .await?;
    let status = match outcome {
        AccessOutcome::Created(_) => StatusCode::CREATED,
        _ => StatusCode::OK,
    };
    let record = outcome.record();
    if !matches!(outcome, AccessOutcome::Unchanged(_)) {
        audit(
            "access_upsert",
            record.spec.kind(),
            record.spec.name(),
            record.revision,
            &record.updated_by,
        );
    }
    Ok((status, Arc::new(record.clone())))
}

async fn delete(
    state: &RegistryState,
    caller: Caller,
    kind: AccessKind,
    name: String,
    expected_revision: Option<u64>,
) -> Result<Response, RegistryError> {
    let actor = caller.actor;
    let revision = state
        .store
        .delete_access(AccessDelete {
            kind,
            name: name.clone(),
            expected_revision,
            actor: actor.clone(),
            source: Source::Admin,
        })
        .await?;
    audit("access_delete", kind, &name, revision, &actor);
    Ok(axum::Json(json!({"revision": revision})).into_response())
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

async fn put_policy(
    RequireEditor(caller): RequireEditor,
    State(state): State<RegistryState>,
    Path(name): Path<String>,
    Params(query): Params,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, RegistryError> {
    let expected = expected_revision(&query, &headers)?;
    let policy: TaskPolicy = parse_json(&body)?;
    let spec = AccessSpec::Policy(PolicyRecord { name, policy });
    let (status, record) = put(&state, caller, spec, expected).await?;
    Ok(with_etag(status, record.revision, present(&record, None)))
}

async fn delete_policy(
    RequireEditor(caller): RequireEditor,
    State(state): State<RegistryState>,
    Path(name): Path<String>,
    Params(query): Params,
    headers: HeaderMap,
) -> Result<Response, RegistryError> {
    let expected = expected_revision(&query, &headers)?;
    delete(&state, caller, AccessKind::Policy, name, expected).await
}

async fn policy_history(
    _caller: RequireViewer,
    State(state): State<RegistryState>,
    Path(name): Path<String>,
) -> Result<Response, RegistryError> {
    let entries = state
        .store
        .access_history(AccessKind::Policy, &name)
        .await?;
    if entries.is_empty() {
        return Err(RegistryError::NotFound(format!(
            "policy {name:?} has no history"
        )));
    }
    let entries: Vec<Value> = entries
        .into_iter()
        .map(|entry| {
            let policy = match entry.spec {
                Some(AccessSpec::Policy(record)) => Some(record.policy),
                _ => None,
            };
            json!({
                "revision": entry.revision,
                "kind": entry.kind.as_str(),
                "policy": policy,
                "at": entry.at,
                "actor": entry.actor,
                "source": entry.source.to_string(),
            })
        })
        .collect();
    Ok(axum::Json(json!({"name": name, "entries": entries})).into_response())
}

/// The body of `POST /admin/api/keys`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewKey {
    name: String,
    policy: String,
    #[serde(default)]
    roles: Vec<Role>,
    #[serde(default)]
    expires_at: Option<DateTime<Utc>>,
}

/// A new key's id and secret: 8 and 32 random bytes.
fn new_key() -> (String, String) {
    let id: [u8; 8] = rand::random();
    let secret: [u8; 32] = rand::random();
    let id = id.iter().map(|b| format!("{b:02x}")).collect();
    let key = format!(
        "{KEY_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret)
    );
    (id, key)
}

async fn create_key(
    RequireAdmin(caller): RequireAdmin,
    State(state): State<RegistryState>,
    body: Bytes,
) -> Result<Response, RegistryError> {
    let request: NewKey = parse_json(&body)?;
    if let Some(at) = request.expires_at
        && at <= Utc::now()
    {
        return Err(RegistryError::invalid(
            "expires_at",
            format!("{} is not in the future", at.to_rfc3339()),
        ));
    }
    let (id, key) = new_key();
    let spec = AccessSpec::ApiKey(ApiKeyRecord {
        id,
        name: request.name,
        policy: request.policy,
        roles: request.roles,
        expires_at: request.expires_at,
        key_sha256: TokenDigest::of(&key).hex(),
    });
    let (status, record) = put(&state, caller, spec, Some(0)).await?;
    let mut body = present(&record, None);
    // The only time the secret leaves the registry.
    body["key"] = json!(key);
    Ok(with_etag(status, record.revision, body))
}

async fn put_provider(
    RequireAdmin(caller): RequireAdmin,
    State(state): State<RegistryState>,
    Path(name): Path<String>,
    Params(query): Params,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, RegistryError> {
    let expected = expected_revision(&query, &headers)?;
    let mut provider: IdentityProviderRecord = parse_json(&body)?;
    if !provider.name.is_empty() && provider.name != name {
        return Err(RegistryError::invalid(
            "name",
            format!(
                "{:?} differs from the name in the path, {name:?}",
                provider.name
            ),
        ));
    }
    // A token's `iss` picks its provider: two with one issuer would leave
    // the choice to their order.
    let head = state.feed.head().await?;
    if let Some(other) = head
        .access_of(AccessKind::IdentityProvider)
        .find_map(|record| match &record.spec {
            AccessSpec::IdentityProvider(other)
                if other.issuer == provider.issuer && other.name != name =>
            {
                Some(other.name.clone())
            }
            _ => None,
        })
    {
        return Err(RegistryError::invalid(
            "issuer",
            format!("identity provider {other:?} has this issuer already"),
        ));
    }
    provider.name = name;
    let spec = AccessSpec::IdentityProvider(provider);
    let (status, record) = put(&state, caller, spec, expected).await?;
    Ok(with_etag(status, record.revision, present(&record, None)))
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
