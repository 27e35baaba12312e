//! What a test sets and reads: the server's scopes and limits, its
//! options, the [`Fault`] it can be told to commit, its users and its
//! counters.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The one scope the server knows and grants by default.
pub const SCOPE: &str = "mcp:tools";
/// The scope the `admin_echo` tool needs beyond [`SCOPE`]: a token without
/// it gets 403 `insufficient_scope` (step-up). The protected resource's
/// metadata does not list it, so clients only ask for it when challenged.
pub const ADMIN_SCOPE: &str = "mcp:admin";
/// The tool that needs [`ADMIN_SCOPE`].
pub const ADMIN_TOOL: &str = "admin_echo";
/// Most clients, pending codes, consent requests, access tokens and refresh
/// tokens held (each); beyond it registrations and grants are refused with
/// 503.
pub const MAX_ENTRIES: usize = 10_000;
/// Default lifetime of access tokens.
pub const DEFAULT_ACCESS_TTL: Duration = Duration::from_secs(3600);
/// Longest access-token lifetime accepted (longer ones are cut to it), so an
/// expiry instant can never overflow.
pub const MAX_ACCESS_TTL: Duration = Duration::from_secs(366 * 24 * 3600);
/// The user `/authorize` approves for until `POST /admin/auto-user` names
/// another.
pub const DEFAULT_AUTO_USER: &str = "auto";
/// Longest user name, in characters.
pub const MAX_USER_LEN: usize = 64;

/// One step at which the server misbehaves on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The authorization server metadata is malformed JSON.
    BadMetadata,
    /// The metadata names another issuer (`http://issuer.invalid`).
    WrongIssuer,
    /// The metadata omits `code_challenge_methods_supported`.
    NoPkce,
    /// `/token` always answers 401 `invalid_client`.
    TokenError,
    /// `/authorize` redirects with a `state` other than the client's.
    StateMismatch,
}

impl Fault {
    /// Every fault, in the order of their names in [`Fault::name`].
    pub const ALL: [Fault; 5] = [
        Fault::BadMetadata,
        Fault::WrongIssuer,
        Fault::NoPkce,
        Fault::TokenError,
        Fault::StateMismatch,
    ];

    /// The fault's flag value (`--fault NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Fault::BadMetadata => "bad-metadata",
            Fault::WrongIssuer => "wrong-issuer",
            Fault::NoPkce => "no-pkce",
            Fault::TokenError => "token-error",
            Fault::StateMismatch => "state-mismatch",
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Fault {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Fault::ALL
            .into_iter()
            .find(|fault| fault.name() == name)
            .ok_or_else(|| {
                let names: Vec<_> = Fault::ALL.iter().map(|fault| fault.name()).collect();
                format!(
                    "unknown fault {name:?}, expected one of {}",
                    names.join(", ")
                )
            })
    }
}

/// The user a code or token was granted for: a name chosen at `/authorize`
/// (1 to [`MAX_USER_LEN`] characters, no control characters), or the client
/// id of a `client_credentials` token.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct User(pub(super) String);

/// A user name that is empty, longer than [`MAX_USER_LEN`] characters or has
/// control characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("user must be 1 to {MAX_USER_LEN} characters without control characters")]
pub struct InvalidUser;

impl User {
    /// A user named `name`.
    pub fn new(name: impl Into<String>) -> Result<Self, InvalidUser> {
        let name = name.into();
        let length = name.chars().count();
        if length == 0 || length > MAX_USER_LEN || name.chars().any(char::is_control) {
            return Err(InvalidUser);
        }
        Ok(Self(name))
    }

    /// The user of `client_credentials` tokens: the client itself, whatever
    /// its id looks like.
    pub(super) fn client(client_id: &str) -> Self {
        Self(client_id.to_owned())
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for User {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for User {
    type Err = InvalidUser;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::new(name)
    }
}

/// A confidential client known before the server starts; it may redirect to
/// any URI on a loopback host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreregisteredClient {
    /// Its client id.
    pub id: String,
    /// Its client secret.
    pub secret: String,
}

impl FromStr for PreregisteredClient {
    type Err = String;

    /// Parses `ID:SECRET` (the secret may contain colons).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.split_once(':') {
            Some((id, secret)) if !id.is_empty() && !secret.is_empty() => Ok(Self {
                id: id.to_owned(),
                secret: secret.to_owned(),
            }),
            _ => Err(format!("expected ID:SECRET, got {text:?}")),
        }
    }
}

/// How the server starts.
#[derive(Debug, Clone)]
pub struct OAuthServerOptions {
    /// Confidential clients registered from the start.
    pub clients: Vec<PreregisteredClient>,
    /// Lifetime of access tokens issued (cut to [`MAX_ACCESS_TTL`]);
    /// `/admin/config` changes it at run time.
    pub access_ttl: Duration,
    /// The step to misbehave at, if any.
    pub fault: Option<Fault>,
    /// `GET /authorize` answers a consent page asking for the user (posted
    /// back to `/authorize`) instead of approving at once for the auto user.
    pub consent_page: bool,
}

impl Default for OAuthServerOptions {
    fn default() -> Self {
        Self {
            clients: Vec::new(),
            access_ttl: DEFAULT_ACCESS_TTL,
            fault: None,
            consent_page: false,
        }
    }
}

/// Counters of what the server did, as `GET /admin/stats` reports them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OAuthStats {
    /// Codes exchanged for tokens.
    pub authorization_code_grants: u64,
    /// Refresh tokens exchanged (and rotated).
    pub refresh_grants: u64,
    /// Refresh attempts refused: unknown, used, revoked or another client's.
    pub refresh_failures: u64,
    /// Client-credentials grants.
    pub client_credentials_grants: u64,
    /// Dynamic client registrations.
    pub registrations: u64,
    /// Requests to `/mcp` let through.
    pub authorized_mcp_requests: u64,
    /// Requests to `/mcp` refused with 401.
    pub rejected_mcp_requests: u64,
    /// `GET /jwks` answered (the OIDC issuer, [`crate::oidc_issuer`]).
    pub jwks_fetches: u64,
    /// `GET /.well-known/openid-configuration` answered.
    pub discovery_fetches: u64,
    /// `id_token`s issued with the tokens of `openid` codes.
    pub id_tokens_issued: u64,
    /// [`OAuthStats::refresh_grants`] by the user of the token refreshed (for
    /// the first [`MAX_ENTRIES`] users), so a test can show that one
    /// person's token was refreshed once however many clients shared it.
    #[serde(default)]
    pub refresh_grants_by_user: BTreeMap<String, u64>,
}
