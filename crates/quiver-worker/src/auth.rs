//! Callers of the worker's APIs: each bearer token maps to a task, whose
//! policy the caller cannot widen (R-CHAT-1).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use quiver_model::policy::{CompiledTaskPolicy, PolicyError, TaskPolicy};
use quiver_model::token::{TokenDigest, bearer};

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

/// Maps presented tokens to tasks.
#[derive(Clone)]
pub struct Callers {
    tokens: Vec<(TokenDigest, Task)>,
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
        let mut tokens = Vec::new();
        for caller in &config.callers {
            if caller.token.is_empty() {
                return Err(CallersError::EmptyToken);
            }
            tokens.push((TokenDigest::of(&caller.token), task(&caller.task)?));
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
        if let Some(token) = bearer(authorization)
            && let Some((_, task)) = self.tokens.iter().find(|(digest, _)| digest.matches(token))
        {
            return Some(task.clone());
        }
        self.anonymous.clone()
    }
}
