//! OAuth bearer tokens on streamable HTTP connections (docs/reference.md
//! §13.6). A record's `http.auth_ref` names an OAuth connection the registry
//! holds; a [`CredentialSource`] (the worker's cache in front of the
//! registry's `GetAccessToken`) hands out its current access token.
//!
//! [`BrokeredClient`] wraps the HTTP client of one connection: every request
//! carries the source's current token, and a request the server answers 401
//! is sent once more with a fresh token (the source is told which token was
//! refused, so it is refreshed rather than handed out again).
//!
//! An OAuth connection is fleet-wide (one grant) or per user (one grant per
//! caller principal, R-OAUTH-8): a connection of a per-user one is opened
//! for one principal ([`GrantRef::principal`]) and carries that principal's
//! grant only.
//!
//! A connection carries one credential only: the grant it opened with. When
//! the source's token belongs to another grant (a new consent, possibly by
//! another person), the connection refuses to send it, marks itself stale
//! and the pool opens a new one; an MCP session never mixes two grants.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use http::{HeaderName, HeaderValue};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::auth::AuthError;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use sha2::{Digest, Sha256};

use crate::error::{AuthorizationRequired, McpError};

/// Which grant of an OAuth connection tokens are asked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GrantRef {
    /// The OAuth connection (`http.auth_ref`).
    pub auth_ref: String,
    /// The caller on whose behalf: a per-user connection hands out that
    /// principal's token; a fleet-wide one ignores it. `None`: the worker's
    /// own business (no caller), which only a fleet-wide connection serves.
    pub principal: Option<String>,
}

impl GrantRef {
    /// The fleet-wide grant of `auth_ref` (or, for a per-user connection,
    /// none: asking fails).
    pub fn fleet(auth_ref: &str) -> Self {
        GrantRef {
            auth_ref: auth_ref.to_owned(),
            principal: None,
        }
    }
}

/// A current access token of one OAuth connection.
#[derive(Clone)]
pub struct Bearer {
    /// The token.
    pub token: String,
    /// The grant it belongs to (same across refreshes, new with a consent).
    pub grant_id: String,
    /// The connection keeps one grant per caller: the token is the asking
    /// principal's own, and so must be the connection that sends it.
    pub per_user: bool,
}

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bearer")
            .field("grant_id", &self.grant_id)
            .field("per_user", &self.per_user)
            .finish_non_exhaustive()
    }
}

/// Why no token can be had.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CredentialError {
    /// A per-user connection and a caller without a grant: its person must
    /// consent first.
    #[error("{0}")]
    AuthorizationRequired(AuthorizationRequired),
    /// A per-user connection asked for no caller (the worker's own
    /// business, or an anonymous caller): nobody's grant serves it.
    #[error("{0}")]
    NoCaller(String),
    /// Anything else (not connected, needs re-consent, registry
    /// unreachable); the message says which.
    #[error("{0}")]
    Unavailable(String),
}

// Lives with the credential refusal rather than in `error`, so the error
// module stays below every module that reports through it.
impl From<CredentialError> for McpError {
    fn from(err: CredentialError) -> Self {
        match err {
            CredentialError::AuthorizationRequired(required) => {
                McpError::AuthorizationRequired(required)
            }
            CredentialError::Unavailable(message) | CredentialError::NoCaller(message) => {
                McpError::Unavailable(message)
            }
        }
    }
}

/// Why a token is asked for again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Renewal<'a> {
    /// The current token, whatever it is.
    #[default]
    Current,
    /// The server refused the token with this [`token_fingerprint`] (401):
    /// not that one again.
    Rejected(&'a str),
    /// The server needs these scopes (403 `insufficient_scope`): a token
    /// that has them, or an error saying a person must consent.
    StepUp(&'a str),
}

/// Where a connection gets its bearer tokens.
#[async_trait]
pub trait CredentialSource: Send + Sync {
    /// The current token of `grant`, renewed as `renewal` says. Errors say
    /// why no token can be had.
    async fn bearer(
        &self,
        grant: &GrantRef,
        renewal: Renewal<'_>,
    ) -> Result<Bearer, CredentialError>;
}

/// Lowercase hex SHA-256 of a token: how a refused token is named without
/// sending it anywhere.
pub fn token_fingerprint(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// The grant one connection carries, fixed by its first token.
#[derive(Debug)]
pub struct GrantBinding {
    source: GrantRef,
    grant: OnceLock<String>,
    stale: OnceLock<String>,
}

impl GrantBinding {
    /// The binding of a connection to `source`'s tokens.
    pub fn new(source: GrantRef) -> Self {
        GrantBinding {
            source,
            grant: OnceLock::new(),
            stale: OnceLock::new(),
        }
    }

    /// Whose tokens the connection sends.
    pub fn source(&self) -> &GrantRef {
        &self.source
    }

    /// Why the connection must not be used any more (its credential's grant
    /// changed), if so.
    pub fn stale(&self) -> Option<&str> {
        self.stale.get().map(String::as_str)
    }

    /// Binds the connection to `bearer`'s grant, or refuses a token of
    /// another grant than the first one (and marks the connection stale).
    pub fn bind(&self, bearer: &Bearer) -> Result<(), String> {
        let bound = self.grant.get_or_init(|| bearer.grant_id.clone());
        if *bound == bearer.grant_id {
            return Ok(());
        }
        let why = format!(
            "oauth connection {:?} was connected again (a new grant); this MCP session carried the previous one and is closed",
            self.source.auth_ref
        );
        let _ = self.stale.set(why.clone());
        Err(why)
    }

    /// Whether the source's current token still belongs to this
    /// connection's grant; a new grant, or a grant revoked, marks the
    /// connection stale before a call is sent on it. (A source that cannot
    /// answer for another reason leaves that to the call itself.)
    pub async fn is_current(&self, source: &dyn CredentialSource) -> bool {
        match source.bearer(&self.source, Renewal::Current).await {
            Ok(bearer) => self.bind(&bearer).is_ok(),
            Err(CredentialError::AuthorizationRequired(_)) => {
                let _ = self.stale.set(format!(
                    "the grant of oauth connection {:?} this MCP session carried was revoked",
                    self.source.auth_ref
                ));
                false
            }
            Err(CredentialError::Unavailable(_) | CredentialError::NoCaller(_)) => true,
        }
    }
}

/// An HTTP client sending one grant's bearer token.
#[derive(Clone)]
pub struct BrokeredClient<C> {
    inner: C,
    source: Arc<dyn CredentialSource>,
    binding: Arc<GrantBinding>,
}

impl<C> BrokeredClient<C> {
    /// Wraps `inner`; the tokens of the grant `binding` names come from
    /// `source`.
    pub fn new(inner: C, source: Arc<dyn CredentialSource>, binding: Arc<GrantBinding>) -> Self {
        BrokeredClient {
            inner,
            source,
            binding,
        }
    }
}

fn refusal<E: std::error::Error + Send + Sync + 'static>(
    message: impl std::fmt::Display,
) -> StreamableHttpError<E> {
    StreamableHttpError::Auth(AuthError::OAuthError(message.to_string()))
}

impl<C: StreamableHttpClient + Send + Sync> BrokeredClient<C> {
    async fn bearer(&self, renewal: Renewal<'_>) -> Result<Bearer, StreamableHttpError<C::Error>> {
        let bearer = self
            .source
            .bearer(self.binding.source(), renewal)
            .await
            .map_err(refusal)?;
        self.binding.bind(&bearer).map_err(refusal)?;
        Ok(bearer)
    }

    /// Runs `call` with the current token; once more with a renewed one when
    /// the server refuses it (401) or needs more scopes (403
    /// `insufficient_scope`).
    async fn with_token<T, F, Fut>(&self, call: F) -> Result<T, StreamableHttpError<C::Error>>
    where
        F: Fn(Option<String>) -> Fut,
        Fut: Future<Output = Result<T, StreamableHttpError<C::Error>>>,
    {
        let sent = self.bearer(Renewal::Current).await?;
        let fresh = match call(Some(sent.token.clone())).await {
            Err(StreamableHttpError::AuthRequired(challenge)) => {
                let fresh = self
                    .bearer(Renewal::Rejected(&token_fingerprint(&sent.token)))
                    .await?;
                if fresh.token == sent.token {
                    return Err(StreamableHttpError::AuthRequired(challenge));
                }
                fresh
            }
            Err(StreamableHttpError::InsufficientScope(challenge)) => {
                let Some(scope) = challenge.required_scope.clone() else {
                    return Err(StreamableHttpError::InsufficientScope(challenge));
                };
                let fresh = self.bearer(Renewal::StepUp(&scope)).await?;
                if fresh.token == sent.token {
                    return Err(StreamableHttpError::InsufficientScope(challenge));
                }
                fresh
            }
            result => return result,
        };
        call(Some(fresh.token)).await
    }
}

impl<C: StreamableHttpClient + Send + Sync> StreamableHttpClient for BrokeredClient<C> {
    type Error = C::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        self.with_token(|token| {
            self.inner.post_message(
                uri.clone(),
                message.clone(),
                session_id.clone(),
                token,
                custom_headers.clone(),
            )
        })
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        self.with_token(|token| {
            self.inner.post_message_with_max_sse_event_size(
                uri.clone(),
                message.clone(),
                session_id.clone(),
                token,
                custom_headers.clone(),
                max_sse_event_size,
            )
        })
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        self.with_token(|token| {
            self.inner.post_message_with_response_limits(
                uri.clone(),
                message.clone(),
                session_id.clone(),
                token,
                custom_headers.clone(),
                limits,
            )
        })
        .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.with_token(|token| {
            self.inner.delete_session(
                uri.clone(),
                session_id.clone(),
                token,
                custom_headers.clone(),
            )
        })
        .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<
        futures::stream::BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>>,
        StreamableHttpError<Self::Error>,
    > {
        self.with_token(|token| {
            self.inner.get_stream(
                uri.clone(),
                session_id.clone(),
                last_event_id.clone(),
                token,
                custom_headers.clone(),
            )
        })
        .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<
        futures::stream::BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>>,
        StreamableHttpError<Self::Error>,
    > {
        self.with_token(|token| {
            self.inner.get_stream_with_max_sse_event_size(
                uri.clone(),
                session_id.clone(),
                last_event_id.clone(),
                token,
                custom_headers.clone(),
                max_sse_event_size,
            )
        })
        .await
    }
}
