//! The tonic `McpSessionService` (docs/reference.md §13.4): the fleet's
//! memory of deleted MCP gateway sessions. The worker that answers a
//! client's `DELETE /mcp` records the session here; a worker about to serve
//! a session it does not hold (or one it holds, every few seconds) asks
//! whether it was deleted. Worker (or admin) credential; rows live until
//! the session id would have expired and are capped by the store
//! ([`quiver_store::MAX_GATEWAY_SESSION_REVOCATIONS`]).

use chrono::{DateTime, Utc};
use quiver_proto::v1 as pb;
use quiver_proto::v1::mcp_session_service_server::McpSessionService;
use tonic::{Request, Response, Status};

use crate::auth::Need;
use crate::error::RegistryError;
use crate::grpc::GrpcService;
use crate::state::RegistryState;

/// Longest lifetime a revocation may ask for: a session id never lives
/// longer than a worker's `max_session_lifetime` allows, which is bounded
/// by the same figure (crate `quiver-worker`, 30 days).
const MAX_REVOCATION_LIFETIME_MS: i64 = 30 * 24 * 3600 * 1000;

/// The service; wraps the shared registry state.
#[derive(Clone)]
pub struct GrpcSessionService {
    inner: GrpcService,
    state: RegistryState,
}

impl GrpcSessionService {
    /// A service over `state`.
    pub fn new(state: RegistryState) -> Self {
        GrpcSessionService {
            inner: GrpcService::new(state.clone()),
            state,
        }
    }
}

/// A session digest: 64 lowercase hex digits.
fn check_digest(digest: &str) -> Result<(), RegistryError> {
    if digest.len() == 64
        && digest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(RegistryError::invalid(
            "session_sha256",
            "must be the lowercase hex SHA-256 of the session's id (64 digits)",
        ))
    }
}

#[tonic::async_trait]
impl McpSessionService for GrpcSessionService {
    async fn revoke_session(
        &self,
        request: Request<pb::RevokeSessionRequest>,
    ) -> Result<Response<pb::RevokeSessionResponse>, Status> {
        self.inner.role(&request, Need::Worker)?;
        let body = request.into_inner();
        check_digest(&body.session_sha256)?;
        let now = Utc::now().timestamp_millis();
        if body.expires_at_ms > now.saturating_add(MAX_REVOCATION_LIFETIME_MS) {
            return Err(RegistryError::invalid(
                "expires_at_ms",
                format!("at most {MAX_REVOCATION_LIFETIME_MS} ms from now"),
            )
            .into());
        }
        let expires_at = DateTime::from_timestamp_millis(body.expires_at_ms)
            .ok_or_else(|| RegistryError::invalid("expires_at_ms", "out of range"))?;
        self.state
            .store
            .revoke_gateway_session(&body.session_sha256, expires_at)
            .await
            .map_err(RegistryError::from)?;
        Ok(Response::new(pb::RevokeSessionResponse {}))
    }

    async fn is_session_revoked(
        &self,
        request: Request<pb::IsSessionRevokedRequest>,
    ) -> Result<Response<pb::IsSessionRevokedResponse>, Status> {
        self.inner.role(&request, Need::Worker)?;
        let digest = &request.get_ref().session_sha256;
        check_digest(digest)?;
        let until = self
            .state
            .store
            .gateway_session_revocation(digest)
            .await
            .map_err(RegistryError::from)?;
        Ok(Response::new(pb::IsSessionRevokedResponse {
            revoked: until.is_some(),
            expires_at_ms: until.map_or(0, |at| at.timestamp_millis()),
        }))
    }
}
