//! Bearer-token credentials and the roles they carry (docs/reference.md §5,
//! §12): `admin` may do everything; `editor` reads and writes MCP server
//! records; `viewer` only reads (records masked, history, audit, workers,
//! approvals, OAuth connection status); `approver` only reads and decides
//! approvals (§13.7); the `worker` token reads records, watches and reports
//! status (the data plane). Tokens are compared in constant time
//! ([`quiver_model::token`]).
//!
//! What a route needs is a [`Need`], named by the extractor its handler
//! takes (`crate::rest`), never by the request's path.

use std::net::SocketAddr;

use quiver_model::token::{TokenDigest, bearer};

use crate::error::RegistryError;

/// What a credential may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Read and decide approvals, nothing else.
    Approver,
    /// Read records, watch, report worker status (the data plane).
    Worker,
    /// Read everything a person may see, write nothing.
    Viewer,
    /// What a viewer may, and write MCP server records.
    Editor,
    /// Everything, including writes.
    Admin,
}

/// What an operation needs; [`Role::allows`] says which roles have it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Admin only: OAuth connection writes and Connect.
    Admin,
    /// Editor or admin: MCP server record writes, previews.
    Editor,
    /// A person's read (viewer, editor, admin): OAuth connection status.
    Viewer,
    /// A read the worker token also makes (viewer, editor, admin, worker):
    /// records (masked), history, audit, workers, evaluate; gRPC reads.
    Reader,
    /// Reading approvals: approver, viewer, editor, admin.
    ApprovalReader,
    /// Deciding approvals: approver or admin.
    Approver,
    /// The data plane's calls (worker or admin): status reports, approval
    /// requests and uses, OAuth access tokens, gateway sessions.
    Worker,
}

impl Need {
    /// The roles that have it, in words, for refusals.
    fn description(self) -> &'static str {
        match self {
            Need::Admin => "the admin role",
            Need::Editor => "the editor role (or admin)",
            Need::Viewer => "the viewer, editor or admin role",
            Need::Reader => "the viewer, editor, admin or worker role",
            Need::ApprovalReader => "the approver, viewer, editor or admin role",
            Need::Approver => "the approver role (or admin)",
            Need::Worker => "the worker token (or admin)",
        }
    }
}

/// Credentials as configured.
#[derive(Clone, Default)]
pub struct AuthConfig {
    /// Token granting [`Role::Admin`].
    pub admin_token: Option<String>,
    /// Token granting [`Role::Worker`].
    pub worker_token: Option<String>,
    /// Token granting [`Role::Editor`].
    pub editor_token: Option<String>,
    /// Token granting [`Role::Viewer`].
    pub viewer_token: Option<String>,
    /// Serve without any credential (every caller is admin). Only allowed on
    /// loopback listeners.
    pub insecure_no_auth: bool,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |token: &Option<String>| token.as_ref().map(|_| "<set>");
        f.debug_struct("AuthConfig")
            .field("admin_token", &set(&self.admin_token))
            .field("worker_token", &set(&self.worker_token))
            .field("editor_token", &set(&self.editor_token))
            .field("viewer_token", &set(&self.viewer_token))
            .field("insecure_no_auth", &self.insecure_no_auth)
            .finish()
    }
}

/// Why a configuration of credentials is refused at start-up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthConfigError {
    /// No token set and no explicit opt-out.
    #[error(
        "no admin, worker, editor or viewer token configured: set --admin-token/--worker-token, or pass --insecure-no-auth for a loopback-only setup"
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
    editor: Option<TokenDigest>,
    viewer: Option<TokenDigest>,
    approver: Option<TokenDigest>,
    insecure: bool,
}

impl Authenticator {
    /// Validates the configuration against the addresses the registry listens on.
    pub fn new(config: &AuthConfig, listeners: &[SocketAddr]) -> Result<Self, AuthConfigError> {
        let tokens = [
            ("admin token", &config.admin_token),
            ("worker token", &config.worker_token),
            ("editor token", &config.editor_token),
            ("viewer token", &config.viewer_token),
        ];
        for (name, token) in tokens {
            if token.as_deref() == Some("") {
                return Err(AuthConfigError::EmptyToken(name));
            }
        }
        let has_tokens = tokens.iter().any(|(_, token)| token.is_some());
        if config.insecure_no_auth {
            if let Some(addr) = listeners.iter().find(|addr| !addr.ip().is_loopback()) {
                return Err(AuthConfigError::InsecureNotLoopback(*addr));
            }
        } else if !has_tokens {
            return Err(AuthConfigError::NoCredentials);
        }
        let digest = |token: &Option<String>| token.as_deref().map(TokenDigest::of);
        Ok(Authenticator {
            admin: digest(&config.admin_token),
            worker: digest(&config.worker_token),
            editor: digest(&config.editor_token),
            viewer: digest(&config.viewer_token),
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
        let presented = TokenDigest::of(token);
        let matches = |expected: &Option<TokenDigest>| {
            expected
                .as_ref()
                .is_some_and(|d| d.matches_digest(&presented))
        };
        // Every digest is compared (no early exit on a match).
        let found = [
            (matches(&self.admin), Role::Admin),
            (matches(&self.worker), Role::Worker),
            (matches(&self.editor), Role::Editor),
            (matches(&self.viewer), Role::Viewer),
            (matches(&self.approver), Role::Approver),
        ];
        found
            .into_iter()
            .find_map(|(matched, role)| matched.then_some(role))
            .ok_or(RegistryError::Unauthenticated)
    }
}

impl Role {
    /// Whether this role has what `need` names.
    pub fn allows(self, need: Need) -> bool {
        use Role::{Admin, Approver, Editor, Viewer, Worker};
        match need {
            Need::Admin => self == Admin,
            Need::Editor => matches!(self, Admin | Editor),
            Need::Viewer => matches!(self, Admin | Editor | Viewer),
            Need::Reader => matches!(self, Admin | Editor | Viewer | Worker),
            Need::ApprovalReader => matches!(self, Admin | Editor | Viewer | Approver),
            Need::Approver => matches!(self, Admin | Approver),
            Need::Worker => matches!(self, Admin | Worker),
        }
    }

    /// Succeeds when this role has what `need` names; else
    /// `permission_denied` naming the role needed and the one presented.
    pub fn require(self, need: Need) -> Result<(), RegistryError> {
        if self.allows(need) {
            return Ok(());
        }
        Err(RegistryError::PermissionDenied(format!(
            "this needs {}; the {} token {}",
            need.description(),
            self.as_str(),
            self.scope()
        )))
    }

    /// What this role may do, in words, for refusals.
    fn scope(self) -> &'static str {
        match self {
            Role::Approver => "may only read and decide approvals",
            Role::Worker => "may only read records and report worker status",
            Role::Viewer => "may only read",
            Role::Editor => "may read and write MCP server records only",
            Role::Admin => "may do everything",
        }
    }

    /// Whether gRPC reads show literal env/header values: the admin's and
    /// the worker's (which starts servers with them); viewer and editor
    /// reads are masked. (REST reads are masked for every role but admin.)
    pub fn reads_literals_over_grpc(self) -> bool {
        matches!(self, Role::Admin | Role::Worker)
    }

    /// The role's name (`whoami`, audit).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Approver => "approver",
            Role::Worker => "worker",
            Role::Viewer => "viewer",
            Role::Editor => "editor",
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
                editor_token: Some("edt".into()),
                viewer_token: Some("vwr".into()),
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
        assert_eq!(auth.authenticate(Some("Bearer edt")).unwrap(), Role::Editor);
        assert_eq!(auth.authenticate(Some("Bearer vwr")).unwrap(), Role::Viewer);
        assert!(Role::Worker.require(Need::Editor).is_err());
        Role::Admin.require(Need::Worker).unwrap();
        let refusal = Role::Viewer.require(Need::Editor).unwrap_err().to_string();
        assert!(
            refusal.contains("editor role") && refusal.contains("the viewer token may only read"),
            "{refusal}"
        );
        assert!(Role::Editor.require(Need::Admin).is_err());
        assert!(Role::Editor.require(Need::Approver).is_err());
        assert!(Role::Approver.require(Need::Reader).is_err());
        Role::Viewer.require(Need::ApprovalReader).unwrap();
        assert!(Role::Worker.require(Need::ApprovalReader).is_err());
        assert!(Role::Viewer.require(Need::Worker).is_err());
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
        let empty_viewer = AuthConfig {
            admin_token: Some("adm".into()),
            viewer_token: Some(String::new()),
            ..Default::default()
        };
        assert_eq!(
            Authenticator::new(&empty_viewer, &[]).err(),
            Some(AuthConfigError::EmptyToken("viewer token"))
        );
    }
}
