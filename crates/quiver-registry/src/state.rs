//! State shared by the gRPC and REST front ends, and the write operations
//! both use (so auditing and metrics happen in one place).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use quiver_bootstrap::{ApplyReport, FileRecord, Scan};
use quiver_mcp::launch::{EnvLookup, process_env};
use quiver_model::{HistoryEntry, McpServerSpec, Strictness};
use quiver_store::{DeleteRequest, Store, UpsertOutcome, UpsertRequest};
use tokio::sync::Mutex;

use crate::auth::{Authenticator, Role};
use crate::error::RegistryError;
use crate::feed::ChangeFeed;
use crate::oauth::broker::OAuthBroker;
use crate::workers::{WorkerBoard, WorkerBoardOptions};

/// Actor recorded for changes made by `mcp.d` rescans.
pub const BOOTSTRAP_ACTOR: &str = "mcp.d";

/// Bound on connecting to an MCP server plus `initialize` and `tools/list`
/// in a tool preview.
pub const PREVIEW_TIMEOUT: Duration = Duration::from_secs(20);

/// How often a write that restores masked values re-reads the record when
/// other writers keep changing it in between.
const MASKED_WRITE_ATTEMPTS: usize = 5;

/// How long an approval waits for its decision and then for its one use
/// when the registry is not told otherwise (`--approval-ttl-secs`).
pub const DEFAULT_APPROVAL_TTL: Duration = Duration::from_secs(900);

/// Pending approvals one caller may have when the registry is not told
/// otherwise (`--max-pending-approvals`).
pub const DEFAULT_MAX_PENDING_PER_CALLER: u32 = 100;

/// How long denied, used and expired approvals are kept after their expiry
/// when the registry is not told otherwise (`--approval-retention-secs`).
pub const DEFAULT_APPROVAL_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// A directory of record files the registry reconciles from: `mcp.d`
/// (servers) or `policies.d` (policies and identity providers).
#[derive(Debug, Clone)]
pub struct BootstrapDir {
    /// Directory path.
    pub path: PathBuf,
    /// Unknown fields and invalid files: errors (strict) or skipped with warnings.
    pub strictness: Strictness,
}

/// Cheap-to-clone handle to everything a request needs.
#[derive(Clone)]
pub struct RegistryState {
    /// The record store.
    pub store: Arc<dyn Store>,
    /// Change fan-out to watchers.
    pub feed: ChangeFeed,
    /// Credential checks.
    pub auth: Authenticator,
    /// Worker status reports.
    pub workers: WorkerBoard,
    mcp_dir: Option<BootstrapDir>,
    policies_dir: Option<BootstrapDir>,
    /// Serialises rescans (SIGHUP, timer and REST may overlap).
    rescan_lock: Arc<Mutex<()>>,
    preview_timeout: Duration,
    preview_env: PreviewEnv,
    preview_egress: quiver_mcp::egress::EgressPolicy,
    approval_ttl: Duration,
    approval_max_pending: u32,
    approval_retention: Duration,
    /// OAuth connections and their tokens (docs/reference.md §13.6).
    pub oauth: OAuthBroker,
    /// People signing in with the registry's identity providers.
    pub signin: Arc<crate::signin::SignIn>,
}

/// Where a tool preview's `${ENV:…}` references and the stdio child's base
/// environment come from: the registry's own environment by default.
#[derive(Clone)]
pub struct PreviewEnv(pub EnvLookup);

impl Default for PreviewEnv {
    fn default() -> Self {
        PreviewEnv(process_env())
    }
}

impl std::fmt::Debug for PreviewEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PreviewEnv(..)")
    }
}

/// Result of one rescan: each configured directory's.
#[derive(Debug)]
pub struct RescanOutcome {
    /// `mcp.d`'s, when configured.
    pub mcp: Option<DirRescan>,
    /// `policies.d`'s, when configured.
    pub policies: Option<DirRescan<quiver_bootstrap::policies::AccessFileRecord>>,
}

/// Result of one directory's rescan.
#[derive(Debug)]
pub struct DirRescan<R = FileRecord> {
    /// What the scan found (records, per-file errors, warnings).
    pub scan: Scan<R>,
    /// What was written.
    pub report: ApplyReport,
}

impl RegistryState {
    /// Assembles the state.
    pub fn new(
        store: Arc<dyn Store>,
        feed: ChangeFeed,
        auth: Authenticator,
        mcp_dir: Option<BootstrapDir>,
    ) -> Self {
        RegistryState {
            store: store.clone(),
            feed,
            auth,
            workers: WorkerBoard::default(),
            mcp_dir,
            policies_dir: None,
            rescan_lock: Arc::new(Mutex::new(())),
            preview_timeout: PREVIEW_TIMEOUT,
            preview_env: PreviewEnv::default(),
            preview_egress: quiver_mcp::egress::EgressPolicy::default(),
            approval_ttl: DEFAULT_APPROVAL_TTL,
            approval_max_pending: DEFAULT_MAX_PENDING_PER_CALLER,
            approval_retention: DEFAULT_APPROVAL_RETENTION,
            oauth: OAuthBroker::new(store, None, "", String::new()),
            signin: Arc::new(crate::signin::SignIn::new(None, "http://localhost")),
        }
    }

    /// The same state reconciling `dir` as `policies.d` too.
    pub fn with_policies_dir(mut self, dir: Option<BootstrapDir>) -> Self {
        self.policies_dir = dir;
        self
    }

    /// The same state with another OAuth broker (the default one has no
    /// key, so it refuses to store secrets).
    pub fn with_oauth(mut self, oauth: OAuthBroker) -> Self {
        self.oauth = oauth;
        self
    }

    /// The same state with another approval lifetime than
    /// [`DEFAULT_APPROVAL_TTL`].
    pub fn with_approval_ttl(mut self, ttl: Duration) -> Self {
        self.approval_ttl = ttl;
        self
    }

    /// How long an approval waits for its decision and its use.
    pub fn approval_ttl(&self) -> Duration {
        self.approval_ttl
    }

    /// The same state with another cap of pending approvals per caller
    /// and retention of finished ones (`ApprovalOptions`).
    pub fn with_approval_limits(mut self, max_pending: u32, retention: Duration) -> Self {
        self.approval_max_pending = max_pending;
        self.approval_retention = retention;
        self
    }

    /// The most pending approvals one caller may have.
    pub fn approval_max_pending(&self) -> u32 {
        self.approval_max_pending
    }

    /// How long finished approvals are kept after their expiry.
    pub fn approval_retention(&self) -> Duration {
        self.approval_retention
    }

    /// The same state with other bounds on the worker board.
    pub fn with_worker_board(mut self, options: WorkerBoardOptions) -> Self {
        self.workers = WorkerBoard::new(options);
        self
    }

    /// The same state with another environment for tool previews.
    pub fn with_preview_env(mut self, env: PreviewEnv) -> Self {
        self.preview_env = env;
        self
    }

    /// The same state with an egress allowlist for tool previews.
    pub fn with_preview_egress(mut self, egress: quiver_mcp::egress::EgressPolicy) -> Self {
        self.preview_egress = egress;
        self
    }

    /// The egress allowlist tool previews connect under.
    pub fn preview_egress(&self) -> &quiver_mcp::egress::EgressPolicy {
        &self.preview_egress
    }

    /// The environment tool previews resolve and launch with.
    pub fn preview_env(&self) -> &EnvLookup {
        &self.preview_env.0
    }

    /// The same state with another bound on tool previews than
    /// [`PREVIEW_TIMEOUT`] (tests, embedders).
    pub fn with_preview_timeout(mut self, timeout: Duration) -> Self {
        self.preview_timeout = timeout;
        self
    }

    /// The bound on connect + `initialize` + `tools/list` of a tool preview.
    pub fn preview_timeout(&self) -> Duration {
        self.preview_timeout
    }

    /// `spec` with every env/header value that is exactly the mask replaced
    /// by the value the stored record with its id holds
    /// ([`McpServerSpec::restore_masked`]); reads nothing when there is no
    /// masked value.
    ///
    /// Only the admin reads secrets, so only the admin may keep one while
    /// changing where it goes: for any other role the record must keep the
    /// stored one's destination ([`keep_masked`]).
    pub async fn restore_masked(
        &self,
        mut spec: McpServerSpec,
        role: Role,
    ) -> Result<McpServerSpec, RegistryError> {
        if spec.has_masked_values() {
            let stored = self.store.get(&spec.server_id).await?;
            keep_masked(&mut spec, stored.as_ref().map(|s| &s.spec), role)?;
        }
        Ok(spec)
    }

    /// [`RegistryState::upsert`] of a record a client may have sent back
    /// with masked values: those keep the stored values (see
    /// [`RegistryState::restore_masked`]).
    ///
    /// The caller's `expected_revision` is checked as usual, and first, so a
    /// stale form hears about the conflict rather than about a masked key.
    /// Without one, the write still expects the revision the kept values were
    /// read at, so a secret changed concurrently is never overwritten by the
    /// value it replaced; such a race re-reads and tries again.
    pub async fn upsert_keeping_masked(
        &self,
        request: UpsertRequest,
        role: Role,
    ) -> Result<UpsertOutcome, RegistryError> {
        if !request.spec.has_masked_values() {
            return self.upsert(request).await;
        }
        let mut attempt = 1;
        loop {
            let stored = self.store.get(&request.spec.server_id).await?;
            let current = stored.as_ref().map_or(0, |s| s.revision);
            if let Some(expected) = request.expected_revision
                && expected != current
            {
                return Err(RegistryError::Conflict {
                    server_id: request.spec.server_id,
                    expected,
                    current,
                });
            }
            let mut spec = request.spec.clone();
            keep_masked(&mut spec, stored.as_ref().map(|s| &s.spec), role)?;
            let written = self
                .upsert(UpsertRequest {
                    spec,
                    expected_revision: Some(current),
                    actor: request.actor.clone(),
                    source: request.source.clone(),
                })
                .await;
            match written {
                Err(RegistryError::Conflict { .. })
                    if request.expected_revision.is_none() && attempt < MASKED_WRITE_ATTEMPTS =>
                {
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// The role of an `authorization` header value and, for an API key,
    /// its principal (`key:<id>`): a configured token first, then a live
    /// API key with roles (from the in-memory head: no database read). The
    /// gRPC API's credentials.
    pub fn authenticate_token(
        &self,
        authorization: Option<&str>,
    ) -> Result<(Role, Option<String>), RegistryError> {
        match self.auth.authenticate(authorization) {
            Ok(role) => Ok((role, None)),
            Err(RegistryError::Unauthenticated) => {
                let token = quiver_model::token::bearer(authorization)
                    .ok_or(RegistryError::Unauthenticated)?;
                let head = self.feed.current_head();
                crate::access::key_role(&head, token)
                    .map(|(role, principal)| (role, Some(principal)))
                    .ok_or(RegistryError::Unauthenticated)
            }
            Err(other) => Err(other),
        }
    }

    /// [`Self::authenticate_token`], then a JWT of one of the registry's
    /// identity providers, whose rules give the roles (its principal
    /// `oidc:<issuer>#<sub>`). The REST API's bearer credentials.
    pub async fn authenticate(
        &self,
        authorization: Option<&str>,
    ) -> Result<(Role, Option<String>), RegistryError> {
        let refused = match self.authenticate_token(authorization) {
            Err(RegistryError::Unauthenticated) => RegistryError::Unauthenticated,
            other => return other,
        };
        let token = quiver_model::token::bearer(authorization).ok_or(refused)?;
        if !quiver_identity::verify::looks_like_jwt(token) {
            return Err(RegistryError::Unauthenticated);
        }
        let head = self.feed.current_head();
        match self.signin.bearer(&head, token).await {
            Some(person) => {
                let person = person?;
                Ok((person.role, Some(person.principal)))
            }
            None => Err(RegistryError::Unauthenticated),
        }
    }

    /// People sign in with the registry's identity providers through
    /// `signin` (its cookies sealed by the OAuth keyring, when configured).
    pub fn with_signin(mut self, signin: crate::signin::SignIn) -> Self {
        self.signin = Arc::new(signin);
        self
    }

    /// Upserts with audit logging and metrics.
    pub async fn upsert(&self, request: UpsertRequest) -> Result<UpsertOutcome, RegistryError> {
        let outcome = self
            .store
            .upsert(request)
            .await
            .map_err(|err| count_write_error(err.into()))?;
        audit_upsert(&outcome, false);
        Ok(outcome)
    }

    /// Applies a batch of upserts in one transaction ([`Store::apply`]),
    /// with audit logging and metrics per record that changed. At most
    /// [`MAX_APPLY_RECORDS`] records: a batch holds the writer lock until it
    /// commits, so its size bounds how long other writers wait.
    pub async fn apply(
        &self,
        requests: Vec<UpsertRequest>,
    ) -> Result<Vec<UpsertOutcome>, RegistryError> {
        if requests.len() > MAX_APPLY_RECORDS {
            return Err(count_write_error(RegistryError::invalid(
                "servers",
                format!(
                    "a batch holds at most {MAX_APPLY_RECORDS} records, got {}",
                    requests.len()
                ),
            )));
        }
        let outcomes = self
            .store
            .apply(requests)
            .await
            .map_err(|err| count_write_error(err.into()))?;
        for outcome in &outcomes {
            audit_upsert(outcome, true);
        }
        Ok(outcomes)
    }

    /// Deletes with audit logging and metrics.
    pub async fn delete(&self, request: DeleteRequest) -> Result<u64, RegistryError> {
        let actor = request.actor.clone();
        let server_id = request.server_id.clone();
        let revision = self
            .store
            .delete(request)
            .await
            .map_err(|err| count_write_error(err.into()))?;
        metrics::counter!("quiver_registry_deletes_total").increment(1);
        tracing::info!(
            target: "quiver::audit",
            action = "delete",
            server_id = %server_id,
            revision,
            actor = %actor,
            "registry change"
        );
        Ok(revision)
    }

    /// History of a record; NOT_FOUND when it never existed.
    pub async fn history(&self, server_id: &str) -> Result<Vec<HistoryEntry>, RegistryError> {
        let entries = self.store.history(server_id).await?;
        if entries.is_empty() {
            return Err(RegistryError::NotFound(format!(
                "mcp server {server_id:?} has no history"
            )));
        }
        Ok(entries)
    }

    /// Reconciles the store with the `mcp.d` directory, then the
    /// `policies.d` one (each that is configured). Both run even when the
    /// first fails; the first error is returned.
    pub async fn rescan(&self) -> Result<RescanOutcome, RegistryError> {
        if !self.has_bootstrap_dir() {
            return Err(RegistryError::FailedPrecondition(
                "no mcp.d or policies.d directory is configured (--mcp-dir, --policies-dir)".into(),
            ));
        }
        let _serialised = self.rescan_lock.lock().await;
        let mcp = match &self.mcp_dir {
            Some(dir) => self.rescan_mcp(dir).await.map(Some),
            None => Ok(None),
        };
        let policies = match &self.policies_dir {
            Some(dir) => {
                crate::policies_dir::reconcile(self.store.as_ref(), &dir.path, dir.strictness)
                    .await
                    .map(|(scan, report)| Some(DirRescan { scan, report }))
            }
            None => Ok(None),
        };
        Ok(RescanOutcome {
            mcp: mcp?,
            policies: policies?,
        })
    }

    async fn rescan_mcp(&self, dir: &BootstrapDir) -> Result<DirRescan, RegistryError> {
        let (scan, report) = quiver_bootstrap::reconcile(
            self.store.as_ref(),
            &dir.path,
            dir.strictness,
            BOOTSTRAP_ACTOR,
        )
        .await
        .map_err(|err| RegistryError::FailedPrecondition(err.to_string()))?;
        // `quiver_bootstrap::reconcile` logged the outcome (at INFO when it
        // changed something).
        tracing::debug!(dir = %dir.path.display(), report = %report, "mcp.d rescanned");
        Ok(DirRescan { scan, report })
    }

    /// Whether an `mcp.d` or `policies.d` directory is configured.
    pub fn has_bootstrap_dir(&self) -> bool {
        self.mcp_dir.is_some() || self.policies_dir.is_some()
    }
}

/// The actor to record: the caller-supplied name when it is sane, else `fallback`.
pub fn actor_name(supplied: Option<&str>, fallback: &str) -> String {
    match supplied.map(str::trim) {
        Some(name)
            if !name.is_empty() && name.len() <= 128 && !name.chars().any(char::is_control) =>
        {
            name.to_owned()
        }
        _ => fallback.to_owned(),
    }
}

/// Counts a failed store write (a conflict, a refused record, the database
/// being unavailable…) in `quiver_registry_write_errors_total{code}`.
/// The most records one batch (`ApplyMcpServers`, `POST
/// /admin/api/servers/apply`) may hold.
pub const MAX_APPLY_RECORDS: usize = 10_000;

/// The first and last revision a batch took (both 0 when nothing changed).
pub(crate) fn revision_range(outcomes: &[UpsertOutcome]) -> (u64, u64) {
    let mut written = outcomes
        .iter()
        .filter(|o| !matches!(o, UpsertOutcome::Unchanged(_)))
        .map(|o| o.server().revision);
    let first = written.next().unwrap_or(0);
    (first, written.next_back().unwrap_or(first))
}

fn count_write_error(err: RegistryError) -> RegistryError {
    metrics::counter!("quiver_registry_write_errors_total", "code" => err.code().as_str())
        .increment(1);
    err
}

/// Counts and audits an upsert that changed its record (the stored record
/// names who wrote it and from where); an unchanged one is not a change.
fn audit_upsert(outcome: &UpsertOutcome, batch: bool) {
    if matches!(outcome, UpsertOutcome::Unchanged(_)) {
        return;
    }
    let server = outcome.server();
    metrics::counter!("quiver_registry_upserts_total").increment(1);
    tracing::info!(
        target: "quiver::audit",
        action = "upsert",
        server_id = %server.spec.server_id,
        revision = server.revision,
        actor = %server.updated_by,
        source = %server.source,
        batch,
        "registry change"
    );
}

/// Restores the masked values of `spec` from `stored`
/// ([`McpServerSpec::restore_masked`]). A role other than admin, which
/// never reads the secrets, may keep them only while they go where they
/// went ([`McpServerSpec::same_destination`]): otherwise an editor could
/// point a record at a server of its own and have the stored header or
/// environment value sent there.
pub fn keep_masked(
    spec: &mut McpServerSpec,
    stored: Option<&McpServerSpec>,
    role: Role,
) -> Result<(), RegistryError> {
    spec.restore_masked(stored)?;
    if role != Role::Admin
        && let Some(stored) = stored
        && !spec.same_destination(stored)
    {
        return Err(RegistryError::PermissionDenied(format!(
            "{}: a masked value keeps a stored secret, which only the admin may send to another destination (transport, stdio command, args and cwd, or HTTP origin); the {} token must enter the values again",
            spec.server_id,
            role.as_str()
        )));
    }
    Ok(())
}
