//! Bearer-token credentials (docs/reference.md §12): admin tokens may read and write,
//! worker tokens may read and report status, approver tokens may only read
//! and decide approvals (§13.7). Tokens are compared in constant
//! time ([`quiver_model::token`]).

use std::net::SocketAddr;

use quiver_model::token::{TokenDigest, bearer};

use crate::error::RegistryError;

/// What a credential may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Read and decide approvals, nothing else (lowest, so requiring any
    /// other role refuses it).
    Approver,
    /// Read records, watch, report worker status.
    Worker,
    /// Everything, including writes.
    Admin,
}

/// Credentials as configured.
#[derive(Clone, Default)]
pub struct AuthConfig {
    /// Token granting [`Role::Admin`].
    pub admin_token: Option<String>,
    /// Token granting [`Role::Worker`].
    pub worker_token: Option<String>,
    /// Serve without any credential (every caller is admin). Only allowed on
    /// loopback listeners.
    pub insecure_no_auth: bool,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("admin_token", &self.admin_token.as_ref().map(|_| "<set>"))
            .field("worker_token", &self.worker_token.as_ref().map(|_| "<set>"))
            .field("insecure_no_auth", &self.insecure_no_auth)
            .finish()
    }
}

/// Why a configuration of credentials is refused at start-up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthConfigError {
    /// Neither token set and no explicit opt-out.
    #[error(
        "no admin or worker token configured: set --admin-token/--worker-token, or pass --insecure-no-auth for a loopback-only setup"
    )]
    NoCredentials,
    /// `--insecure-no-auth` with a listener reachable from other hosts.
    #[error("--insecure-no-auth is only allowed on loopback listeners, but {0} is not loopback")]
    InsecureNotLoopback(SocketAddr),
    /// An empty token would match an empty header.
    #[error("{0} must not be empty")]
    EmptyToken(&'static str),
}

/// Checks presented tokens against the configured ones.
#[derive(Clone)]
pub struct Authenticator {
    admin: Option<TokenDigest>,
    worker: Option<TokenDigest>,
    approver: Option<TokenDigest>,
    insecure: bool,
}

impl Authenticator {
    /// Validates the configuration against the addresses the registry listens on.
    pub fn new(config: &AuthConfig, listeners: &[SocketAddr]) -> Result<Self, AuthConfigError> {
        for (name, token) in [
            ("admin token", &config.admin_token),
            ("worker token", &config.worker_token),
        ] {
            if token.as_deref() == Some("") {
                return Err(AuthConfigError::EmptyToken(name));
            }
        }
        let has_tokens = config.admin_token.is_some() || config.worker_token.is_some();
        if config.insecure_no_auth {
            if let Some(addr) = listeners.iter().find(|addr| !addr.ip().is_loopback()) {
                return Err(AuthConfigError::InsecureNotLoopback(*addr));
            }
        } else if !has_tokens {
            return Err(AuthConfigError::NoCredentials);
        }
        Ok(Authenticator {
            admin: config.admin_token.as_deref().map(TokenDigest::of),
            worker: config.worker_token.as_deref().map(TokenDigest::of),
            approver: None,
            insecure: config.insecure_no_auth && !has_tokens,
        })
    }

    /// The same checks, also granting [`Role::Approver`] to `token` (kept
    /// apart from [`AuthConfig`] so existing configurations need no change).
    pub fn with_approver_token(mut self, token: Option<&str>) -> Result<Self, AuthConfigError> {
        if token == Some("") {
            return Err(AuthConfigError::EmptyToken("approver token"));
        }
        self.approver = token.map(TokenDigest::of);
        Ok(self)
    }

    /// Whether requests are served without credentials.
    pub fn is_insecure(&self) -> bool {
        self.insecure
    }

    /// The role of an `authorization` header value (`Bearer <token>`).
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Role, RegistryError> {
        if self.insecure {
            return Ok(Role::Admin);
        }
        let token = bearer(authorization).ok_or(RegistryError::Unauthenticated)?;
        let matches =
            |expected: &Option<TokenDigest>| expected.as_ref().is_some_and(|d| d.matches(token));
        if matches(&self.admin) {
            Ok(Role::Admin)
        } else if matches(&self.worker) {
            Ok(Role::Worker)
        } else if matches(&self.approver) {
            Ok(Role::Approver)
        } else {
            Err(RegistryError::Unauthenticated)
        }
    }
}

impl Role {
    /// Succeeds when this role includes `needed`.
    pub fn require(self, needed: Role) -> Result<(), RegistryError> {
        if self >= needed {
            Ok(())
        } else if self == Role::Approver {
            Err(RegistryError::PermissionDenied(
                "the approver token may only read and decide approvals".into(),
            ))
        } else {
            Err(RegistryError::PermissionDenied(
                "this operation needs the admin token".into(),
            ))
        }
    }

    /// Succeeds for the roles that may read and decide approvals (admin,
    /// approver); the worker token may not.
    pub fn require_approver(self) -> Result<(), RegistryError> {
        match self {
            Role::Admin | Role::Approver => Ok(()),
            Role::Worker => Err(RegistryError::PermissionDenied(
                "deciding approvals needs the admin or approver token".into(),
            )),
        }
    }

    /// The role's name (`whoami`, audit).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Approver => "approver",
            Role::Worker => "worker",
            Role::Admin => "admin",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn tokens_map_to_roles() {
        let auth = Authenticator::new(
            &AuthConfig {
                admin_token: Some("adm".into()),
                worker_token: Some("wrk".into()),
                insecure_no_auth: false,
            },
            &[addr("0.0.0.0:1")],
        )
        .unwrap();
        assert_eq!(auth.authenticate(Some("Bearer adm")).unwrap(), Role::Admin);
        assert_eq!(auth.authenticate(Some("Bearer wrk")).unwrap(), Role::Worker);
        assert!(auth.authenticate(Some("Bearer nope")).is_err());
        assert!(auth.authenticate(Some("adm")).is_err());
        assert!(auth.authenticate(None).is_err());
        assert!(Role::Worker.require(Role::Admin).is_err());
        Role::Admin.require(Role::Worker).unwrap();
    }

    #[test]
    fn refuses_to_start_without_credentials() {
        assert_eq!(
            Authenticator::new(&AuthConfig::default(), &[addr("127.0.0.1:1")]).err(),
            Some(AuthConfigError::NoCredentials)
        );
        let insecure = AuthConfig {
            insecure_no_auth: true,
            ..Default::default()
        };
        assert_eq!(
            Authenticator::new(&insecure, &[addr("127.0.0.1:1"), addr("0.0.0.0:2")]).err(),
            Some(AuthConfigError::InsecureNotLoopback(addr("0.0.0.0:2")))
        );
        let auth = Authenticator::new(&insecure, &[addr("127.0.0.1:1"), addr("[::1]:2")]).unwrap();
        assert_eq!(auth.authenticate(None).unwrap(), Role::Admin);
        let empty = AuthConfig {
            admin_token: Some(String::new()),
            ..Default::default()
        };
        assert!(Authenticator::new(&empty, &[]).is_err());
    }
}
