//! Client-side credentials for the registry API: every request carries
//! `authorization: Bearer <token>` and, optionally, the actor recorded for
//! writes (`x-quiver-actor`).

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::v1::mcp_approval_service_client::McpApprovalServiceClient;
use crate::v1::mcp_o_auth_service_client::McpOAuthServiceClient;
use crate::v1::mcp_registry_service_client::McpRegistryServiceClient;
use crate::v1::mcp_session_service_client::McpSessionServiceClient;
use crate::v1::mcp_usage_service_client::McpUsageServiceClient;

/// Metadata key naming the person or system behind a write (audit).
pub const ACTOR_METADATA: &str = "x-quiver-actor";

/// A registry client with its credentials attached.
pub type RegistryClient = McpRegistryServiceClient<InterceptedService<Channel, Credentials>>;

/// An approvals client (docs/reference.md §13.7) with its credentials attached.
pub type ApprovalClient = McpApprovalServiceClient<InterceptedService<Channel, Credentials>>;

/// An OAuth token client (docs/reference.md §13.6) with its credentials attached.
pub type OAuthClient = McpOAuthServiceClient<InterceptedService<Channel, Credentials>>;

/// A gateway-session revocation client (docs/reference.md §13.4) with its
/// credentials attached.
pub type SessionClient = McpSessionServiceClient<InterceptedService<Channel, Credentials>>;

/// A rate-limit and usage client (docs/reference.md §12.3) with its
/// credentials attached.
pub type UsageClient = McpUsageServiceClient<InterceptedService<Channel, Credentials>>;

/// A token or actor that cannot be sent as header text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0} is not valid header text")]
pub struct InvalidCredential(&'static str);

/// Adds the credentials to every request.
#[derive(Clone, Default)]
pub struct Credentials {
    authorization: Option<MetadataValue<Ascii>>,
    actor: Option<MetadataValue<Ascii>>,
}

impl Credentials {
    /// Credentials of `token` (none: anonymous) acting as `actor`.
    pub fn new(token: Option<&str>, actor: Option<&str>) -> Result<Self, InvalidCredential> {
        let authorization = token
            .map(|token| {
                let mut value: MetadataValue<Ascii> = format!("Bearer {token}")
                    .parse()
                    .map_err(|_| InvalidCredential("the token"))?;
                value.set_sensitive(true);
                Ok(value)
            })
            .transpose()?;
        let actor = actor
            .map(|actor| actor.parse().map_err(|_| InvalidCredential("the actor")))
            .transpose()?;
        Ok(Credentials {
            authorization,
            actor,
        })
    }

    /// A client over `channel` sending these credentials.
    pub fn client(self, channel: Channel) -> RegistryClient {
        McpRegistryServiceClient::with_interceptor(channel, self)
    }

    /// An approvals client over `channel` sending these credentials.
    pub fn approval_client(self, channel: Channel) -> ApprovalClient {
        McpApprovalServiceClient::with_interceptor(channel, self)
    }

    /// An OAuth token client over `channel` sending these credentials.
    pub fn oauth_client(self, channel: Channel) -> OAuthClient {
        McpOAuthServiceClient::with_interceptor(channel, self)
    }

    /// A gateway-session revocation client over `channel` sending these credentials.
    pub fn session_client(self, channel: Channel) -> SessionClient {
        McpSessionServiceClient::with_interceptor(channel, self)
    }

    /// A rate-limit and usage client over `channel` sending these credentials.
    pub fn usage_client(self, channel: Channel) -> UsageClient {
        McpUsageServiceClient::with_interceptor(channel, self)
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("token", &self.authorization.as_ref().map(|_| "<set>"))
            .field("actor", &self.actor)
            .finish()
    }
}

impl Interceptor for Credentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        if let Some(value) = &self.actor {
            request.metadata_mut().insert(ACTOR_METADATA, value.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_go_into_metadata() {
        let mut credentials = Credentials::new(Some("t0k"), Some("alice")).unwrap();
        let request = credentials.call(tonic::Request::new(())).unwrap();
        assert_eq!(
            request.metadata().get("authorization").unwrap(),
            "Bearer t0k"
        );
        assert_eq!(request.metadata().get(ACTOR_METADATA).unwrap(), "alice");
        let request = Credentials::default()
            .call(tonic::Request::new(()))
            .unwrap();
        assert!(request.metadata().is_empty());
        assert!(Credentials::new(Some("bad\ntoken"), None).is_err());
    }
}
