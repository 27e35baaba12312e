//! The audit lines of the broker: what happened to whose grant, by whom.

use chrono::{DateTime, Utc};
use quiver_store::GrantKey;

pub(super) fn audit(
    action: &'static str,
    name: &str,
    actor: &str,
    expires_at: Option<DateTime<Utc>>,
) {
    audit_grant(action, GrantKey::fleet(name), actor, expires_at);
}

pub(super) fn audit_grant(
    action: &'static str,
    grant: GrantKey<'_>,
    actor: &str,
    expires_at: Option<DateTime<Utc>>,
) {
    tracing::info!(
        target: "quiver::audit",
        action,
        oauth_connection = %grant.connection,
        principal = grant.principal.unwrap_or(""),
        actor = %actor,
        expires_at = ?expires_at,
        "oauth"
    );
}
