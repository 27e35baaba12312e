//! Callers of the worker's APIs: each bearer token maps to a task, whose
//! policy the caller cannot widen (R-CHAT-1).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use quiver_model::policy::{CompiledTaskPolicy, PolicyError, TaskPolicy};
use quiver_model::token::{TokenDigest, bearer};
use sha2::{Digest as _, Sha256};

/// The task callers get with `--caller-token` and in dev mode.
pub const DEFAULT_TASK: &str = "default";

/// One configured caller credential.
#[derive(Clone)]
pub struct CallerToken {
    /// The token.
    pub token: String,
    /// The task it selects.
    pub task: String,
}

impl std::fmt::Debug for CallerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallerToken")
            .field("task", &self.task)
            .finish_non_exhaustive()
    }
}

/// Caller configuration as written.
#[derive(Debug, Clone, Default)]
pub struct CallersConfig {
    /// Tokens and their tasks.
    pub callers: Vec<CallerToken>,
    /// Task policies by name; `default` is implied (every enabled server,
    /// no narrowing) unless configured.
    pub tasks: BTreeMap<String, TaskPolicy>,
    /// Serve callers without a token as task `default` (loopback only).
    pub insecure_no_auth: bool,
}

/// Why a caller configuration is refused.
#[derive(Debug, thiserror::Error)]
pub enum CallersError {
    /// A task policy is invalid.
    #[error("task {task:?}: {error}")]
    Task {
        /// The task.
        task: String,
        /// What is wrong (names the field).
        error: PolicyError,
    },
    /// A caller names a task that is not configured.
    #[error("caller token for task {0:?}: no such task")]
    UnknownTask(String),
    /// An empty token.
    #[error("caller tokens must not be empty")]
    EmptyToken,
    /// Two tokens are the same caller (the same token twice).
    #[error("caller token #{0} is configured twice (each token is one caller)")]
    DuplicateToken(usize),
    /// Nobody could call the worker.
    #[error(
        "no caller token configured: pass --caller-token (or [[callers]] in the config), or --insecure-no-auth on a loopback listener"
    )]
    NoCallers,
    /// `--insecure-no-auth` on a public listener.
    #[error("--insecure-no-auth is only allowed on a loopback listener, not {0}")]
    InsecureNotLoopback(SocketAddr),
}

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
/// (`--insecure-no-auth`) are one.
///
/// The id is the first 8 bytes of the token's SHA-256, so the same token is
/// the same caller on every worker of a fleet and across restarts (an
/// approval requested through one worker is the same caller's on another).
/// Eight bytes of a digest of a random token reveal nothing usable about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallerId([u8; 8]);

impl CallerId {
    /// The caller without a token.
    pub const ANONYMOUS: CallerId = CallerId([0xff; 8]);

    /// The caller presenting `token`.
    fn of_token(token: &str) -> Self {
        let digest = Sha256::digest(token.as_bytes());
        let mut id = [0; 8];
        id.copy_from_slice(&digest[..8]);
        CallerId(id)
    }

    /// A short opaque form, for signed artifact URLs and keys (not secret).
    pub fn tag(self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
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
        Some(CallerId(id))
    }

    /// The principal this caller is in audit lines and approvals:
    /// `token:<tag>` for a configured token, `anonymous` without one.
    pub fn principal(self) -> String {
        if self == Self::ANONYMOUS {
            "anonymous".to_owned()
        } else {
            format!("token:{}", self.tag())
        }
    }
}

/// Maps presented tokens to tasks.
#[derive(Clone)]
pub struct Callers {
    tokens: Vec<(TokenDigest, CallerId, Task)>,
    anonymous: Option<Task>,
}

impl Callers {
    /// Compiles every task and checks the configuration against the listener.
    pub fn new(config: &CallersConfig, listen: SocketAddr) -> Result<Self, CallersError> {
        let mut tasks = BTreeMap::new();
        tasks.insert(
            DEFAULT_TASK.to_owned(),
            Arc::new(CompiledTaskPolicy::unrestricted()),
        );
        for (name, policy) in &config.tasks {
            let compiled = policy.compile().map_err(|error| CallersError::Task {
                task: name.clone(),
                error,
            })?;
            tasks.insert(name.clone(), Arc::new(compiled));
        }
        let task = |name: &str| {
            tasks
                .get(name)
                .map(|policy| Task {
                    name: name.to_owned(),
                    policy: policy.clone(),
                })
                .ok_or_else(|| CallersError::UnknownTask(name.to_owned()))
        };
        let mut tokens: Vec<(TokenDigest, CallerId, Task)> = Vec::new();
        for (at, caller) in config.callers.iter().enumerate() {
            if caller.token.is_empty() {
                return Err(CallersError::EmptyToken);
            }
            let id = CallerId::of_token(&caller.token);
            if tokens.iter().any(|(_, other, _)| *other == id) {
                return Err(CallersError::DuplicateToken(at + 1));
            }
            tokens.push((TokenDigest::of(&caller.token), id, task(&caller.task)?));
        }
        let anonymous = if config.insecure_no_auth {
            if !listen.ip().is_loopback() {
                return Err(CallersError::InsecureNotLoopback(listen));
            }
            Some(task(DEFAULT_TASK)?)
        } else if tokens.is_empty() {
            return Err(CallersError::NoCallers);
        } else {
            None
        };
        Ok(Callers { tokens, anonymous })
    }

    /// The task of an `Authorization` header value; `None` when refused.
    pub fn authenticate(&self, authorization: Option<&str>) -> Option<Task> {
        self.identify(authorization).map(|(task, _)| task)
    }

    /// The task and the credential of an `Authorization` header value;
    /// `None` when refused.
    pub fn identify(&self, authorization: Option<&str>) -> Option<(Task, CallerId)> {
        if let Some(token) = bearer(authorization)
            && let Some((_, id, task)) = self
                .tokens
                .iter()
                .find(|(digest, _, _)| digest.matches(token))
        {
            return Some((task.clone(), *id));
        }
        self.anonymous
            .clone()
            .map(|task| (task, CallerId::ANONYMOUS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_token_is_its_own_caller() {
        let caller = |token: &str| CallerToken {
            token: token.into(),
            task: DEFAULT_TASK.into(),
        };
        let config = CallersConfig {
            callers: vec![caller("a"), caller("b")],
            ..Default::default()
        };
        let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let callers = Callers::new(&config, listen).unwrap();
        let (task_a, a) = callers.identify(Some("Bearer a")).unwrap();
        let (task_b, b) = callers.identify(Some("Bearer b")).unwrap();
        assert_eq!(task_a.name, task_b.name);
        assert_ne!(a, b);
        assert_eq!(callers.identify(Some("Bearer a")).unwrap().1, a);
        assert!(callers.identify(Some("Bearer c")).is_none());
        assert!(callers.identify(None).is_none());
        assert_eq!(CallerId::from_tag(&a.tag()), Some(a));
        assert_eq!(
            a,
            CallerId::of_token("a"),
            "the same token is the same caller anywhere"
        );
        assert_eq!(a.principal(), format!("token:{}", a.tag()));
        assert_eq!(CallerId::ANONYMOUS.principal(), "anonymous");
        assert!(CallerId::from_tag("zz").is_none());
        let twice = CallersConfig {
            callers: vec![caller("a"), caller("a")],
            ..Default::default()
        };
        assert!(matches!(
            Callers::new(&twice, listen),
            Err(CallersError::DuplicateToken(2))
        ));

        let open = Callers::new(
            &CallersConfig {
                insecure_no_auth: true,
                ..Default::default()
            },
            listen,
        )
        .unwrap();
        assert_eq!(open.identify(None).unwrap().1, CallerId::ANONYMOUS);
    }
}
