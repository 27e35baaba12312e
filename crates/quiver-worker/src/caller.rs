//! Who an authenticated caller is: its task, its credential's id, how it
//! authenticated, or why it is refused. Both the configured callers
//! (`crate::auth`) and the registry's (`crate::registry_callers`) produce
//! these, so they sit below both.

use std::collections::BTreeMap;
use std::sync::Arc;

use quiver_model::ErrorCode;
use quiver_model::policy::CompiledTaskPolicy;
use sha2::{Digest as _, Sha256};

/// The task of an authenticated caller.
#[derive(Debug, Clone)]
pub struct Task {
    /// Task name (audit).
    pub name: String,
    /// Its compiled policy.
    pub policy: Arc<CompiledTaskPolicy>,
}

/// Which credential a caller presented: the owner of the artifacts its
/// calls produce (`crate::artifacts`), of its per-session connections and
/// gateway sessions, and the principal approvals and audit lines name. Two
/// tokens of the same task are two callers; callers without a token
/// (`--insecure-no-auth`) are one; an identity provider's caller is its
/// `oidc:<issuer>#<sub>` whatever token it presents.
///
/// The id is the first 8 bytes of the SHA-256 of the token (of the
/// principal for an identity provider's caller), so the same caller is the
/// same on every worker of a fleet and across restarts (an approval
/// requested through one worker is the same caller's on another). Eight
/// bytes of a digest of a random token reveal nothing usable about it.
/// Callers compare by id only.
#[derive(Debug, Clone)]
pub struct CallerId {
    id: [u8; 8],
    /// The principal, where it is known when the caller is made: a
    /// configured token's `token:<tag>` (made once, not on every call),
    /// an identity provider's `oidc:<issuer>#<sub>`.
    principal: Option<Arc<str>>,
}

impl PartialEq for CallerId {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for CallerId {}

impl std::hash::Hash for CallerId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

impl PartialOrd for CallerId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for CallerId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.id.cmp(&other.id)
    }
}

impl CallerId {
    /// The caller without a token.
    pub const ANONYMOUS: CallerId = CallerId {
        id: [0xff; 8],
        principal: None,
    };

    /// The caller presenting `token`.
    pub(crate) fn of_token(token: &str) -> Self {
        let id = first_8(token);
        CallerId {
            id,
            principal: Some(Arc::from(format!("token:{}", hex::encode(id)))),
        }
    }

    /// A caller the registry names: `key:<id>` for an API key,
    /// `oidc:<issuer>#<sub>` for an identity provider's caller.
    pub fn of_principal(principal: Arc<str>) -> Self {
        CallerId {
            id: first_8(&principal),
            principal: Some(principal),
        }
    }

    /// A short opaque form, for signed artifact URLs and keys (not secret).
    pub fn tag(&self) -> String {
        hex::encode(self.id)
    }

    /// The caller of [`tag`](Self::tag).
    pub fn from_tag(tag: &str) -> Option<Self> {
        if tag.len() != 16 || !tag.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut id = [0; 8];
        for (at, byte) in id.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&tag[2 * at..2 * at + 2], 16).ok()?;
        }
        Some(CallerId {
            id,
            principal: None,
        })
    }

    /// The principal this caller is in audit lines and approvals:
    /// `token:<tag>` for a configured token, `oidc:<issuer>#<sub>` for an
    /// identity provider's caller, `anonymous` without one.
    pub fn principal(&self) -> String {
        if let Some(principal) = &self.principal {
            principal.to_string()
        } else if *self == Self::ANONYMOUS {
            "anonymous".to_owned()
        } else {
            format!("token:{}", self.tag())
        }
    }

    /// The principal whose grants of per-user OAuth connections this
    /// caller's calls use (R-OAUTH-8); the anonymous caller has none.
    pub fn grant_principal(&self) -> Option<String> {
        (*self != Self::ANONYMOUS).then(|| self.principal())
    }

    /// This caller's session `session_id` (a name it chose, or a gateway
    /// session) under `task`, as per-session connections are keyed: another
    /// caller naming the same id has another session, and so has this one
    /// under another task.
    pub fn session(
        &self,
        task: &Task,
        kind: quiver_mcp::leases::SessionKind,
        session_id: String,
    ) -> quiver_mcp::leases::SessionKey {
        quiver_mcp::leases::SessionKey {
            caller: self.principal(),
            task: task.name.clone(),
            kind,
            session_id,
        }
    }
}

fn first_8(text: &str) -> [u8; 8] {
    let digest = Sha256::digest(text.as_bytes());
    let mut id = [0; 8];
    id.copy_from_slice(&digest[..8]);
    id
}

/// How a caller authenticated (`/v1/whoami`'s `via`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A configured caller token, or none (`--insecure-no-auth`).
    Static,
    /// A JWT of an identity provider (configured or the registry's).
    Oidc,
    /// An API key the registry holds.
    Key,
}

impl Via {
    /// As `/v1/whoami` names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Static => "static",
            Via::Oidc => "oidc",
            Via::Key => "key",
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone)]
pub struct Authenticated {
    /// Its task.
    pub task: Task,
    /// Its credential (and principal).
    pub id: CallerId,
    /// How it authenticated.
    pub via: Via,
}

/// Why a caller is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 401 `unauthenticated`, with why.
    Unauthenticated(String),
    /// 403 `identity_no_matching_rule`: a verified token no rule of its
    /// provider gives a task.
    NoMatchingRule {
        /// The provider.
        provider: String,
        /// The caller.
        principal: String,
    },
}

impl Refusal {
    /// The error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Refusal::Unauthenticated(_) => ErrorCode::Unauthenticated,
            Refusal::NoMatchingRule { .. } => ErrorCode::IdentityNoMatchingRule,
        }
    }

    /// The message.
    pub fn message(&self) -> String {
        match self {
            Refusal::Unauthenticated(why) => why.clone(),
            Refusal::NoMatchingRule {
                provider,
                principal,
            } => format!(
                "{principal} is authenticated by identity provider {provider}, but none of its rules gives it a task"
            ),
        }
    }
}

/// The caller of a verified JWT: the policy its provider's deciding rule
/// names, looked up in `policies` (a worker's tasks for a configured
/// provider, the registry's policies for one of the registry's); 403
/// `identity_no_matching_rule` without one.
pub(crate) fn oidc_caller(
    verified: &quiver_identity::Verified,
    policies: &BTreeMap<String, Arc<CompiledTaskPolicy>>,
) -> Result<Authenticated, Refusal> {
    let policy = verified
        .policy
        .as_deref()
        .and_then(|name| policies.get(name).map(|policy| (name, policy)));
    let Some((name, policy)) = policy else {
        return Err(Refusal::NoMatchingRule {
            provider: verified.provider.clone(),
            principal: verified.principal.to_string(),
        });
    };
    Ok(Authenticated {
        task: Task {
            name: name.to_owned(),
            policy: policy.clone(),
        },
        id: CallerId::of_principal(verified.principal.clone()),
        via: Via::Oidc,
    })
}
