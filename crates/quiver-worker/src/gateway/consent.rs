//! Consent to per-user OAuth grants at the gateway (§13.6 **R-OAUTH-8**):
//! a call of a server that acts as each caller, by a caller that has not
//! connected its account yet, asks the person at the client to open the
//! caller's consent link in the protocol the client speaks:
//!
//! - on a session (2025-11-25) whose client declared URL elicitation: an
//!   `elicitation/create` in URL mode before the call runs; once the client
//!   accepts, the call waits (at most the tool's timeout) for the grant to
//!   land and then runs as that person;
//! - without a session (2026-07-28) whose client declared URL elicitation:
//!   the call ends in `input_required` with the link as a URL elicitation
//!   ([`CONSENT_INPUT`]); the retry runs with the grant;
//! - otherwise (or when the person did not consent in time): the tool error
//!   carries the link (`authorization_url`), as on the tool API.
//!
//! The link is a credential of the caller: it goes to the client only, in
//! no log line.

use std::time::Duration;

use quiver_mcp::{AuthorizationRequired, McpError, McpPool};
use quiver_model::StoredServer;
use rmcp::RoleServer;
use rmcp::model::ElicitationAction;
use rmcp::service::{ElicitationMode, Peer};

/// The input key of a consent link's URL elicitation (2026-07-28).
pub const CONSENT_INPUT: &str = "quiver-authorization";

/// How often a session's call looks for the grant while the person
/// consents.
const GRANT_POLL: Duration = Duration::from_millis(250);

/// What the person at the client is told.
pub fn message(required: &AuthorizationRequired) -> String {
    format!(
        "Connect your account to {:?}: open the link, consent, and the call continues as you.",
        required.connection
    )
}

/// Whether a client with `capabilities` declared URL elicitation.
pub fn opens_links(capabilities: &rmcp::model::ClientCapabilities) -> bool {
    capabilities
        .elicitation
        .as_ref()
        .is_some_and(|elicitation| elicitation.url.is_some())
}

/// On a session: when `principal` must first connect its account for
/// `server` and the client can open links, asks it to, and waits (at most
/// the server's `tool_timeout_ms`) until the grant is there. Returns
/// without asking otherwise; the call then reports what stands.
pub async fn connect_first(
    peer: &Peer<RoleServer>,
    pool: &McpPool,
    server: &StoredServer,
    principal: Option<&str>,
) {
    if !peer
        .supported_elicitation_modes()
        .contains(&ElicitationMode::Url)
    {
        return;
    }
    let Err(McpError::AuthorizationRequired(required)) = pool.check_grant(server, principal).await
    else {
        return;
    };
    let Ok(url) = url::Url::parse(&required.url) else {
        return;
    };
    let wait = Duration::from_millis(server.spec.budgets.tool_timeout_ms);
    let deadline = tokio::time::Instant::now() + wait;
    let elicitation_id = format!("{CONSENT_INPUT}/{}", required.connection);
    let asked = peer
        .elicit_url_with_timeout(message(&required), url, elicitation_id, Some(wait))
        .await;
    if !matches!(asked, Ok(ElicitationAction::Accept)) {
        return;
    }
    // The person is on its way through the link: the grant lands when the
    // authorization server sends the browser back to the registry.
    while tokio::time::Instant::now() < deadline {
        if pool.check_grant(server, principal).await.is_ok() {
            return;
        }
        tokio::time::sleep(GRANT_POLL).await;
    }
}
