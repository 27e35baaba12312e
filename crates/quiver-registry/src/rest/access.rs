//! The admin API of who may call (docs/reference.md §12.2): `/policies`,
//! `/keys`, `/identity/providers` (reads for the viewer and up; policies
//! written by the editor, keys and providers by the admin) and
//! `POST /access/explain`. The records and their writes are
//! [`crate::access`]'s; the explanation [`crate::explain`]'s.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use chrono::{DateTime, Utc};
use quiver_model::access::{
    AccessKind, AccessSpec, ApiKeyRecord, IdentityProviderRecord, PolicyRecord, Role, StoredAccess,
};
use quiver_model::policy::TaskPolicy;
use quiver_model::token::TokenDigest;
use quiver_store::AccessOutcome;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{RegistryError, parse_json};
use crate::explain::{ExplainRequest, Explanation, explain_verified};
use crate::rest::extract::{Caller, Params, RequireAdmin, RequireEditor, RequireViewer};
use crate::rest::revision::{expected_revision, with_etag};
use crate::state::RegistryState;

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
        .route("/access/explain", post(explain))
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

/// Writes a record as the caller; 201 when created.
async fn put(
    state: &RegistryState,
    caller: Caller,
    spec: AccessSpec,
    expected_revision: Option<u64>,
) -> Result<(StatusCode, StoredAccess), RegistryError> {
    Ok(
        match crate::access::put(state.store.as_ref(), spec, expected_revision, caller.actor)
            .await?
        {
            AccessOutcome::Created(record) => (StatusCode::CREATED, record),
            AccessOutcome::Updated(record) | AccessOutcome::Unchanged(record) => {
                (StatusCode::OK, record)
            }
        },
    )
}

async fn delete(
    state: &RegistryState,
    caller: Caller,
    kind: AccessKind,
    name: String,
    expected_revision: Option<u64>,
) -> Result<Response, RegistryError> {
    let revision = crate::access::delete(
        state.store.as_ref(),
        kind,
        name,
        expected_revision,
        caller.actor,
    )
    .await?;
    Ok(axum::Json(json!({"revision": revision})).into_response())
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
    let (id, key) = crate::access::new_key();
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

/// `POST /admin/api/access/explain`.
async fn explain(
    _caller: RequireViewer,
    State(state): State<RegistryState>,
    body: Bytes,
) -> Result<Response, RegistryError> {
    let request: ExplainRequest = parse_json(&body)?;
    let head = state.feed.head().await?;
    let jwt = request
        .token
        .as_deref()
        .filter(|token| quiver_identity::verify::looks_like_jwt(token));
    let answer = match jwt {
        Some(token) if request.key_id.is_none() && request.subject.is_none() => {
            match state.signin.verify(&head, token).await {
                Ok(verified) => {
                    explain_verified(&head, &verified, &request.server_id, &request.tool)
                }
                Err(why) => {
                    Explanation::deny("token_refused", format!("the token is refused: {why}"))
                }
            }
        }
        _ => crate::explain::explain(&head, &request)?,
    };
    Ok(axum::Json(answer).into_response())
}
