//! What handlers read from a request: the caller, one extractor per role
//! requirement ([`RequireAdmin`], [`RequireEditor`], [`RequireViewer`],
//! [`RequireReader`], [`RequireApprovalReader`], [`RequireApprover`], and
//! [`AnyRole`] for `whoami`), the query string ([`Params`]) and the body as
//! text ([`body_text`]).

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;

use crate::auth::{Need, Role};
use crate::error::RegistryError;
use crate::state::{RegistryState, actor_name};

/// Header naming the person behind a write (audit), like the gRPC metadata.
pub const ACTOR_HEADER: &str = "x-quiver-actor";

/// The query parameters of a request. Each name may appear once: a repeated
/// one is an error naming it (which value would win is not the caller's
/// guess to make). Names and values must decode to UTF-8.
pub(crate) struct Params(pub(crate) HashMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = RegistryError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let mut params = HashMap::new();
        for pair in parts.uri.query().unwrap_or_default().split('&') {
            if pair.is_empty() {
                continue;
            }
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let (Some(name), Some(value)) = (form_decoded(name), form_decoded(value)) else {
                return Err(RegistryError::InvalidArgument {
                    field: None,
                    message: format!("query parameter {pair:?} is not percent-encoded UTF-8"),
                });
            };
            if params.contains_key(&name) {
                return Err(RegistryError::invalid(
                    name.as_str(),
                    format!("query parameter {name:?} is given more than once"),
                ));
            }
            params.insert(name, value);
        }
        Ok(Params(params))
    }
}

/// `application/x-www-form-urlencoded` decoding (`+` is a space, `%XX` a
/// byte); `None` when the bytes are not UTF-8 or an escape is malformed.
fn form_decoded(text: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&byte, tail)) = rest.split_first() {
        rest = tail;
        match byte {
            b'+' => bytes.push(b' '),
            b'%' => {
                let hex = std::str::from_utf8(rest.get(..2)?).ok()?;
                bytes.push(u8::from_str_radix(hex, 16).ok()?);
                rest = &rest[2..];
            }
            other => bytes.push(other),
        }
    }
    String::from_utf8(bytes).ok()
}

/// A `true`/`false` query parameter, `default` when absent.
pub(super) fn flag(
    query: &HashMap<String, String>,
    name: &str,
    default: bool,
) -> Result<bool, RegistryError> {
    match query.get(name).map(String::as_str) {
        None => Ok(default),
        Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(other) => Err(RegistryError::invalid(
            name,
            format!("{other:?} is not true or false"),
        )),
    }
}

/// A request body as text: record and import bodies are UTF-8.
pub(super) fn body_text(body: &Bytes) -> Result<&str, RegistryError> {
    std::str::from_utf8(body).map_err(|_| RegistryError::InvalidArgument {
        field: None,
        message: "request body is not UTF-8".into(),
    })
}

/// The authenticated caller of a request, as an extractor below let it
/// through.
pub(crate) struct Caller {
    pub(crate) role: Role,
    pub(crate) actor: String,
    /// `key:<id>` or `oidc:<issuer>#<sub>` when the credential names one.
    pub(crate) principal: Option<String>,
    /// `token`, `key`, `oidc` (a bearer JWT) or `session` (the web admin's
    /// cookie).
    pub(crate) via: &'static str,
}

impl Caller {
    /// Whether reads must mask literal values: always without the admin
    /// role, on request (`?masked=true`) with it.
    pub(super) fn masks(&self, query: &HashMap<String, String>) -> Result<bool, RegistryError> {
        Ok(self.role != Role::Admin || flag(query, "masked", false)?)
    }
}

/// Declares an extractor that lets through the callers whose role has
/// `$need` and refuses the others (403 `permission_denied` naming the role
/// needed and the one presented). Which extractor a handler takes decides
/// who may call it, never the request's path (docs/reference.md §5).
macro_rules! requirement {
    ($(#[$doc:meta])* $name:ident, $need:expr) => {
        $(#[$doc])*
        #[allow(dead_code, reason = "some routes need only the check, not the caller")]
        pub(crate) struct $name(pub(crate) Caller);

        impl FromRequestParts<RegistryState> for $name {
            type Rejection = RegistryError;

            async fn from_request_parts(
                parts: &mut Parts,
                state: &RegistryState,
            ) -> Result<Self, Self::Rejection> {
                let caller = http_identity(parts, state).await?;
                caller.role.require($need)?;
                Ok($name(caller))
            }
        }
    };
}

requirement!(
    /// The admin role only: OAuth connection writes and Connect.
    RequireAdmin,
    Need::Admin
);
requirement!(
    /// Editor or admin: MCP server record writes, imports, rescans, previews.
    RequireEditor,
    Need::Editor
);
requirement!(
    /// Viewer, editor or admin: what people read that the worker token does
    /// not (OAuth connection status).
    RequireViewer,
    Need::Viewer
);
requirement!(
    /// Viewer, editor, admin or the worker token: record reads (masked
    /// unless admin), history, audit, workers, evaluate.
    RequireReader,
    Need::Reader
);
requirement!(
    /// Approver, viewer, editor or admin: reading approvals.
    RequireApprovalReader,
    Need::ApprovalReader
);
requirement!(
    /// Approver or admin: deciding approvals.
    RequireApprover,
    Need::Approver
);

/// Any authenticated caller, whatever its role: the extractor of `whoami`,
/// which the web admin signs in with.
pub(crate) struct AnyRole(pub(crate) Caller);

impl FromRequestParts<RegistryState> for AnyRole {
    type Rejection = RegistryError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &RegistryState,
    ) -> Result<Self, Self::Rejection> {
        Ok(AnyRole(http_identity(parts, state).await?))
    }
}

/// Who sends an HTTP request: a configured token, an API key or a JWT of
/// an identity provider (`Authorization: Bearer`), else a web admin
/// session cookie. Who acts is the principal when the credential names one
/// (audit names it, not a claimed actor), else the `x-quiver-actor` header,
/// else the name of the token's kind.
pub(crate) async fn http_identity(
    parts: &Parts,
    state: &RegistryState,
) -> Result<Caller, RegistryError> {
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
    let authorization = header(header::AUTHORIZATION.as_str());
    let (role, principal, via) = match authorization {
        None => match crate::signin::session_person(&state.signin, &parts.method, &parts.headers) {
            Some(person) => {
                let person = person?;
                (person.role, Some(person.principal), "session")
            }
            None => {
                let (role, principal) = state.authenticate(None).await?;
                (role, principal, "token")
            }
        },
        Some(_) => {
            let (role, principal) = state.authenticate(authorization).await?;
            let via = match principal.as_deref() {
                Some(p) if p.starts_with("key:") => "key",
                Some(_) => "oidc",
                None => "token",
            };
            (role, principal, via)
        }
    };
    let actor = principal
        .clone()
        .unwrap_or_else(|| actor_name(header(ACTOR_HEADER), role.as_str()));
    Ok(Caller {
        role,
        actor,
        principal,
        via,
    })
}
