//! What an administrator says about an OAuth connection (the body of `PUT
//! /admin/api/oauth/connections/{name}`), its validation, and what reads
//! show of it. Reads never carry a secret or a token: the client secret is
//! only said to be there (`has_client_secret`).

use chrono::{DateTime, Utc};
use quiver_store::{OAuthConnectionRow, OAuthStatus};
use serde::{Deserialize, Serialize};

use crate::error::RegistryError;

/// Longest connection name.
const MAX_NAME_CHARS: usize = 128;
/// Most scopes one connection asks for.
const MAX_SCOPES: usize = 64;
/// Longest URL, client id, scope or secret.
const MAX_VALUE_CHARS: usize = 2048;

/// How the registry obtains tokens for a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grant {
    /// A person consents once in the browser (web admin "Connect");
    /// refresh tokens keep the connection alive.
    #[default]
    AuthorizationCode,
    /// Machine to machine: the registry asks for a token with the client's
    /// id and secret whenever it needs one.
    ClientCredentials,
}

/// The settings of one OAuth connection; the secret is input only.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthConnectionSpec {
    /// The MCP server (protected resource) the tokens are for.
    pub server_url: String,
    /// How tokens are obtained.
    #[serde(default)]
    pub grant: Grant,
    /// A pre-registered client id; without one the registry uses the client
    /// metadata document or dynamic registration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// The pre-registered client's secret (absent: keep the stored one;
    /// empty: remove it). Never stored as given nor shown again.
    #[serde(default, skip_serializing)]
    pub client_secret: Option<String>,
    /// An HTTPS URL of a client ID metadata document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_metadata_url: Option<String>,
    /// Scopes to ask for; empty: what the server's metadata suggests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// The widest scopes a step-up (a server's 403 `insufficient_scope`
    /// relayed by a worker) may widen the connection to; absent: `scopes`,
    /// i.e. a step-up never widens. Set by an admin only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_scopes: Option<Vec<String>>,
    /// One grant per caller principal instead of one for the fleet
    /// (R-OAUTH-8): each person consents for themself, and a call acts as
    /// the principal that made it. Authorization code only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub per_user: bool,
}

/// Checks a connection name (the records' `http.auth_ref`).
pub fn check_name(name: &str) -> Result<(), RegistryError> {
    let valid =
        quiver_model::is_valid_credential_name(name) && name.chars().count() <= MAX_NAME_CHARS;
    if valid {
        Ok(())
    } else {
        Err(RegistryError::invalid(
            "name",
            format!("must be 1-{MAX_NAME_CHARS} letters, digits, '_', '.' or '-'"),
        ))
    }
}

fn check_url(field: &str, value: &str, https_only: bool) -> Result<(), RegistryError> {
    if value.chars().count() > MAX_VALUE_CHARS {
        return Err(RegistryError::invalid(
            field,
            format!("must be at most {MAX_VALUE_CHARS} characters"),
        ));
    }
    let url = url::Url::parse(value)
        .map_err(|err| RegistryError::invalid(field, format!("is not a URL: {err}")))?;
    let scheme_ok = match url.scheme() {
        "https" => true,
        "http" => !https_only,
        _ => false,
    };
    if !scheme_ok || url.host_str().is_none() {
        let wanted = if https_only { "https" } else { "http or https" };
        return Err(RegistryError::invalid(
            field,
            format!("must be an absolute {wanted} URL"),
        ));
    }
    Ok(())
}

fn check_value(field: &str, value: &str) -> Result<(), RegistryError> {
    if value.is_empty() || value.chars().count() > MAX_VALUE_CHARS {
        return Err(RegistryError::invalid(
            field,
            format!("must be 1-{MAX_VALUE_CHARS} characters"),
        ));
    }
    if value.chars().any(|c| c.is_control() || c == ' ') {
        return Err(RegistryError::invalid(
            field,
            "must not contain spaces or control characters",
        ));
    }
    Ok(())
}

impl OAuthConnectionSpec {
    /// Parses a request body; errors name the field.
    pub fn from_json(body: &[u8]) -> Result<Self, RegistryError> {
        let spec: OAuthConnectionSpec = crate::error::parse_json(body)?;
        spec.validate()?;
        Ok(spec)
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), RegistryError> {
        check_url("server_url", &self.server_url, false)?;
        if let Some(id) = &self.client_id {
            check_value("client_id", id)?;
        }
        if let Some(secret) = self.client_secret.as_deref().filter(|s| !s.is_empty()) {
            if secret.chars().count() > MAX_VALUE_CHARS || secret.chars().any(char::is_control) {
                return Err(RegistryError::invalid(
                    "client_secret",
                    format!(
                        "must be at most {MAX_VALUE_CHARS} characters without control characters"
                    ),
                ));
            }
            if self.client_id.is_none() {
                return Err(RegistryError::invalid(
                    "client_secret",
                    "needs client_id: a secret belongs to a pre-registered client",
                ));
            }
        }
        if let Some(url) = &self.client_metadata_url {
            check_url("client_metadata_url", url, true)?;
        }
        if self.scopes.len() > MAX_SCOPES {
            return Err(RegistryError::invalid(
                "scopes",
                format!("at most {MAX_SCOPES} scopes"),
            ));
        }
        for (index, scope) in self.scopes.iter().enumerate() {
            check_value(&format!("scopes[{index}]"), scope)?;
        }
        if let Some(ceiling) = &self.max_scopes {
            if ceiling.len() > MAX_SCOPES {
                return Err(RegistryError::invalid(
                    "max_scopes",
                    format!("at most {MAX_SCOPES} scopes"),
                ));
            }
            for (index, scope) in ceiling.iter().enumerate() {
                check_value(&format!("max_scopes[{index}]"), scope)?;
            }
            if let Some(outside) = self.scopes.iter().find(|s| !ceiling.contains(s)) {
                return Err(RegistryError::invalid(
                    "max_scopes",
                    format!("must include every scope of scopes; {outside:?} is missing"),
                ));
            }
        }
        if self.per_user && self.grant == Grant::ClientCredentials {
            return Err(RegistryError::invalid(
                "per_user",
                "needs grant \"authorization_code\": client credentials act as the client, never as a person",
            ));
        }
        if self.grant == Grant::ClientCredentials && self.client_id.is_none() {
            return Err(RegistryError::invalid(
                "client_id",
                "is required with grant \"client_credentials\"",
            ));
        }
        Ok(())
    }

    /// The widest scopes a step-up may reach: `max_scopes`, else `scopes`.
    pub fn scope_ceiling(&self) -> &[String] {
        self.max_scopes.as_deref().unwrap_or(&self.scopes)
    }

    /// The settings as stored (no secret).
    pub fn config_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Status as reads show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShownStatus {
    /// No token yet (or the settings changed): press Connect.
    NotConnected,
    /// A token is held and not about to expire.
    Connected,
    /// The access token expires within [`EXPIRING_WITHIN`]; the next use
    /// refreshes it.
    Expiring,
    /// The authorization server refused the refresh token: a person must
    /// connect again.
    NeedsReconsent,
}

impl ShownStatus {
    /// How the token state of `row` reads at `now`.
    pub fn of(row: &OAuthConnectionRow, now: DateTime<Utc>) -> Self {
        match row.status {
            OAuthStatus::NotConnected => ShownStatus::NotConnected,
            OAuthStatus::NeedsReconsent => ShownStatus::NeedsReconsent,
            OAuthStatus::Connected => match row.expires_at {
                Some(at) if at - now <= EXPIRING_WITHIN => ShownStatus::Expiring,
                _ => ShownStatus::Connected,
            },
        }
    }
}

/// An access token this close to its expiry shows as `expiring`.
pub const EXPIRING_WITHIN: chrono::Duration = chrono::Duration::minutes(5);

/// What reads show of a connection.
#[derive(Debug, Clone, Serialize)]
pub struct OAuthConnectionView {
    /// The name records use as `http.auth_ref`.
    pub name: String,
    /// The settings (without the secret).
    #[serde(flatten)]
    pub spec: OAuthConnectionSpec,
    /// Whether a client secret is stored.
    pub has_client_secret: bool,
    /// Connection status.
    pub status: ShownStatus,
    /// When the current access token expires, when known.
    pub expires_at: Option<DateTime<Utc>>,
    /// When a person (or the client credentials grant) last connected it.
    pub connected_at: Option<DateTime<Utc>>,
    /// Refreshes so far.
    pub refresh_count: u64,
    /// The last failure, naming its step.
    pub last_error: Option<String>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

impl OAuthConnectionView {
    /// The view of a stored row at `now`.
    pub fn of(row: &OAuthConnectionRow, now: DateTime<Utc>) -> Result<Self, RegistryError> {
        let spec: OAuthConnectionSpec = serde_json::from_str(&row.config).map_err(|err| {
            RegistryError::Internal(format!("stored oauth connection {:?}: {err}", row.name))
        })?;
        let status = ShownStatus::of(row, now);
        Ok(OAuthConnectionView {
            name: row.name.clone(),
            spec,
            has_client_secret: row.client_secret.is_some(),
            status,
            expires_at: row.expires_at,
            connected_at: row.connected_at,
            refresh_count: row.refresh_count,
            last_error: row.last_error.clone(),
            updated_at: row.updated_at,
        })
    }
}

/// One principal's grant of a per-user connection, as reads show it (never
/// a token).
#[derive(Debug, Clone, Serialize)]
pub struct OAuthGrantView {
    /// The connection.
    pub connection: String,
    /// Whose grant it is.
    pub principal: String,
    /// `connected`, `expiring` or `needs_reconsent`.
    pub status: ShownStatus,
    /// When its access token expires, when known.
    pub expires_at: Option<DateTime<Utc>>,
    /// When the principal consented.
    pub connected_at: Option<DateTime<Utc>>,
    /// How often its token was refreshed.
    pub refresh_count: u64,
    /// The last failure.
    pub last_error: Option<String>,
}

impl OAuthGrantView {
    /// The view of a principal's grant row; `None` for a connection's own.
    pub fn of(row: &OAuthConnectionRow, now: DateTime<Utc>) -> Option<Self> {
        Some(OAuthGrantView {
            connection: row.name.clone(),
            principal: row.principal.clone()?,
            status: ShownStatus::of(row, now),
            expires_at: row.expires_at,
            connected_at: row.connected_at,
            refresh_count: row.refresh_count,
            last_error: row.last_error.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(body: &str) -> Option<String> {
        match OAuthConnectionSpec::from_json(body.as_bytes()) {
            Err(RegistryError::InvalidArgument { field, .. }) => field,
            other => panic!("{body}: {other:?}"),
        }
    }

    #[test]
    fn bad_settings_are_refused_naming_the_field() {
        assert_eq!(
            field_of(r#"{"server_url": "ftp://x"}"#).as_deref(),
            Some("server_url")
        );
        assert_eq!(
            field_of(r#"{"server_url": 1}"#).as_deref(),
            Some("server_url")
        );
        assert_eq!(
            field_of(r#"{"server_url": "http://x", "grant": "password"}"#).as_deref(),
            Some("grant")
        );
        assert_eq!(
            field_of(r#"{"server_url": "http://x", "extra": 1}"#).as_deref(),
            Some("extra")
        );
        assert_eq!(
            field_of(r#"{"server_url": "http://x", "client_secret": "s"}"#).as_deref(),
            Some("client_secret")
        );
        assert_eq!(
            field_of(r#"{"server_url": "http://x", "grant": "client_credentials"}"#).as_deref(),
            Some("client_id")
        );
        assert_eq!(
            field_of(r#"{"server_url": "http://x", "client_metadata_url": "http://x/c.json"}"#)
                .as_deref(),
            Some("client_metadata_url")
        );
        assert_eq!(
            field_of(r#"{"server_url": "http://x", "scopes": ["a b"]}"#).as_deref(),
            Some("scopes[0]")
        );
        let spec = OAuthConnectionSpec::from_json(
            br#"{"server_url": "http://127.0.0.1:1/mcp", "client_id": "c", "client_secret": "s"}"#,
        )
        .unwrap();
        assert!(
            !spec.config_json().contains("\"s\""),
            "{}",
            spec.config_json()
        );
    }
}
