//! Callers of the worker's APIs: each bearer token maps to a task, whose
//! policy the caller cannot widen (R-CHAT-1).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use quiver_model::policy::{CompiledTaskPolicy, PolicyError, TaskPolicy};
use quiver_model::token::{TokenDigest, bearer};

use quiver_identity::{Identities, Provider, ProviderError};
use quiver_model::access::IdentityProviderRecord;

use crate::caller::oidc_caller;
pub use crate::caller::{Authenticated, CallerId, Refusal, Task, Via};
use crate::registry_callers::RegistryCallers;

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
    /// Identity providers whose JWTs are callers (`[[identity_providers]]`).
    pub identity_providers: Vec<IdentityProviderRecord>,
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
    /// An identity provider is invalid (names the field).
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// `--insecure-no-auth` on a public listener.
    #[error("--insecure-no-auth is only allowed on a loopback listener, not {0}")]
    InsecureNotLoopback(SocketAddr),
}

/// The 401 message of a missing or unknown bearer token.
pub const MISSING_OR_INVALID: &str = "missing or invalid bearer token";

/// Maps presented tokens to tasks.
#[derive(Clone)]
pub struct Callers {
    tokens: Vec<(TokenDigest, CallerId, Task)>,
    anonymous: Option<Task>,
    identities: Option<Arc<Identities>>,
    tasks: BTreeMap<String, Arc<CompiledTaskPolicy>>,
    registry: Option<Arc<RegistryCallers>>,
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
        let providers = Provider::all(&config.identity_providers, |name| tasks.contains_key(name))?;
        let anonymous = if config.insecure_no_auth {
            if !listen.ip().is_loopback() {
                return Err(CallersError::InsecureNotLoopback(listen));
            }
            Some(task(DEFAULT_TASK)?)
        } else {
            None
        };
        let identities = (!providers.is_empty()).then(|| Arc::new(Identities::new(providers)));
        Ok(Callers {
            tokens,
            anonymous,
            identities,
            tasks,
            registry: None,
        })
    }

    /// Also serves the callers the registry holds (API keys, its policies
    /// and identity providers), after the configured ones.
    pub fn with_registry(mut self, registry: Arc<RegistryCallers>) -> Self {
        self.registry = Some(registry);
        self
    }

    /// The registry's callers, when served.
    pub fn registry(&self) -> Option<&Arc<RegistryCallers>> {
        self.registry.as_ref()
    }

    /// The caller of an `Authorization` header value: a configured token
    /// first (no allocation but the task's clone), then the registry's API
    /// keys (one map lookup of the same digest), then a JWT of a configured
    /// identity provider or the registry's, then the anonymous caller if
    /// allowed.
    pub async fn identify(&self, authorization: Option<&str>) -> Result<Authenticated, Refusal> {
        let token = bearer(authorization);
        if let Some(token) = token {
            // Hashed once, whatever the number of configured tokens.
            let presented = TokenDigest::of(token);
            if let Some((_, id, task)) = self
                .tokens
                .iter()
                .find(|(digest, _, _)| digest.matches_digest(&presented))
            {
                return Ok(Authenticated {
                    task: task.clone(),
                    id: id.clone(),
                    via: Via::Static,
                });
            }
            if let Some(found) = self.registry.as_ref().and_then(|r| r.key(&presented)) {
                return found;
            }
            if quiver_identity::verify::looks_like_jwt(token) {
                return self.of_jwt(token).await;
            }
        }
        match &self.anonymous {
            Some(task) => Ok(Authenticated {
                task: task.clone(),
                id: CallerId::ANONYMOUS,
                via: Via::Static,
            }),
            None => Err(Refusal::Unauthenticated(MISSING_OR_INVALID.to_owned())),
        }
    }

    /// A JWT: of a configured provider (its rules name configured tasks),
    /// else of one of the registry's (naming the registry's policies).
    async fn of_jwt(&self, token: &str) -> Result<Authenticated, Refusal> {
        let configured = match &self.identities {
            Some(identities) => identities.verify(token).await,
            None => Err(quiver_identity::Refused::WrongIssuer),
        };
        let verified = match (configured, &self.registry) {
            (Err(quiver_identity::Refused::WrongIssuer), Some(registry)) => {
                return registry.jwt(token).await.map_err(|refusal| {
                    refusal.unwrap_or_else(|| {
                        Refusal::Unauthenticated(format!(
                            "bearer token refused: {}",
                            quiver_identity::Refused::WrongIssuer
                        ))
                    })
                });
            }
            (verified, _) => verified
                .map_err(|why| Refusal::Unauthenticated(format!("bearer token refused: {why}")))?,
        };
        oidc_caller(&verified, &self.tasks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_token_is_its_own_caller() {
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
        let id = async |header: Option<&str>| callers.identify(header).await;
        let Authenticated {
            task: task_a,
            id: a,
            via,
        } = id(Some("Bearer a")).await.unwrap();
        let Authenticated {
            task: task_b,
            id: b,
            ..
        } = id(Some("Bearer b")).await.unwrap();
        assert_eq!(via, Via::Static);
        assert_eq!(task_a.name, task_b.name);
        assert_ne!(a, b);
        assert_eq!(id(Some("Bearer a")).await.unwrap().id, a);
        assert_eq!(
            id(Some("Bearer c")).await.unwrap_err(),
            Refusal::Unauthenticated(MISSING_OR_INVALID.into())
        );
        assert!(id(None).await.is_err());
        assert_eq!(CallerId::from_tag(&a.tag()), Some(a.clone()));
        assert_eq!(
            a,
            CallerId::of_token("a"),
            "the same token is the same caller anywhere"
        );
        assert_eq!(a.principal(), format!("token:{}", a.tag()));
        let oidc = CallerId::of_principal("oidc:https://idp#alice".into());
        assert_eq!(oidc.principal(), "oidc:https://idp#alice");
        assert_eq!(oidc, CallerId::from_tag(&oidc.tag()).unwrap());
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
        assert_eq!(open.identify(None).await.unwrap().id, CallerId::ANONYMOUS);
    }
}
