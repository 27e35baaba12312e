//! State shared by the gRPC and REST front ends, and the write operations
//! both use (so auditing and metrics happen in one place).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use quiver_bootstrap::{ApplyReport, FileRecord, Scan};
use quiver_mcp::launch::{EnvLookup, process_env};
use quiver_model::{ChangeKind, HistoryEntry, McpServerSpec, Source, Strictness};
use quiver_store::{DeleteRequest, HistoryPage, HistoryRow, Store, UpsertOutcome, UpsertRequest};
use serde::Serialize;
use serde_json::Value;
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

/// Entries of an audit page when the caller names no limit.
pub const AUDIT_DEFAULT_LIMIT: u32 = 100;

/// Most entries one audit page holds.
pub const AUDIT_MAX_LIMIT: u32 = 1000;

/// `changed_fields` of the first revision of a record (and of one created
/// again after a delete).
pub const CREATED_MARKER: &str = "(created)";

/// `changed_fields` of a delete.
pub const DELETED_MARKER: &str = "(deleted)";

/// In `changed_fields` when the record's source (owner) changed, e.g. a record
/// that moved to another `mcp.d` file or was taken over by a file.
pub const SOURCE_MARKER: &str = "(source)";

/// Which registry changes an audit page holds ([`RegistryState::audit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditQuery {
    /// `None`: the newest changes, newest first. `Some(n)`: the changes after
    /// revision `n`, oldest first.
    pub since_revision: Option<u64>,
    /// Only changes of this record.
    pub server_id: Option<String>,
    /// At most this many entries (1…[`AUDIT_MAX_LIMIT`]).
    pub limit: u32,
}

/// One registry change: who changed which record how, at which revision.
/// Holds field paths only, never values, so secrets cannot leak through it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditEntry {
    /// The revision the change created.
    pub revision: u64,
    /// The record changed.
    pub server_id: String,
    /// Upsert or delete.
    pub kind: ChangeKind,
    /// Who made the change.
    pub actor: String,
    /// Where the change came from (`admin`, `api`, `file:<name>`).
    pub source: Source,
    /// Commit time.
    pub at: DateTime<Utc>,
    /// The record's revision the change is a change against; `None` for its
    /// first revision.
    pub previous_revision: Option<u64>,
    /// The diff summary against `previous_revision` (see [`changed_fields`]).
    pub changed_fields: Vec<String>,
}

/// One page of the audit trail ([`RegistryState::audit`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditPage {
    /// `newest_first` (no `since_revision`) or `oldest_first`.
    pub order: &'static str,
    /// The registry's head revision, read after the page (so at least the
    /// revision of every entry).
    pub head_revision: u64,
    /// The changes, in `order`.
    pub entries: Vec<AuditEntry>,
    /// Whether more changes lie beyond this page in its order (older ones
    /// for `newest_first`, newer ones for `oldest_first`).
    pub more: bool,
    /// The `since_revision` that asks for the changes after those seen so
    /// far: the newest revision of the page (the query's `since_revision`,
    /// or 0, when the page is empty).
    pub next_since_revision: u64,
}

/// The diff summary of one history row against the same record's previous
/// row: [`DELETED_MARKER`] for a delete, [`CREATED_MARKER`] for a first
/// revision or a re-creation after a delete, else the paths of the changed
/// fields ([`spec_changes`]) followed by [`SOURCE_MARKER`] when the source
/// changed too.
pub fn changed_fields(entry: &HistoryEntry, previous: Option<&HistoryEntry>) -> Vec<String> {
    if entry.kind == ChangeKind::Delete {
        return vec![DELETED_MARKER.to_owned()];
    }
    // A previous delete (or no previous row) makes this a creation.
    let before = previous
        .filter(|p| p.kind == ChangeKind::Upsert)
        .and_then(|p| Some((p, p.spec.as_ref()?)));
    match (before, entry.spec.as_ref()) {
        (Some((previous, before)), Some(after)) => {
            let mut fields = spec_changes(before, after);
            if previous.source != entry.source {
                fields.push(SOURCE_MARKER.to_owned());
            }
            fields
        }
        _ => vec![CREATED_MARKER.to_owned()],
    }
}

/// Dotted paths (`mcp.d` field names) of the fields that differ between two
/// versions of a record, sorted. Objects are descended into, with map keys
/// as path segments (`budgets.max_concurrency`, `stdio.env.API_KEY`,
/// `labels.team`); arrays and scalars are compared whole (`allowed_tools`,
/// `stdio.args`). Only paths are returned, never values.
pub fn spec_changes(before: &McpServerSpec, after: &McpServerSpec) -> Vec<String> {
    let mut paths = BTreeSet::new();
    match (serde_json::to_value(before), serde_json::to_value(after)) {
        (Ok(before), Ok(after)) => diff_paths("", Some(&before), Some(&after), &mut paths),
        // A record is plain strings, numbers and string-keyed maps, so this
        // cannot happen; say "something changed" rather than nothing.
        _ => {
            paths.insert("(record)".to_owned());
        }
    }
    paths.into_iter().collect()
}

/// Adds to `out` the paths under `path` where `before` and `after` differ
/// (absent and `null` are the same).
fn diff_paths(
    path: &str,
    before: Option<&Value>,
    after: Option<&Value>,
    out: &mut BTreeSet<String>,
) {
    let before = before.filter(|v| !v.is_null());
    let after = after.filter(|v| !v.is_null());
    if before == after {
        return;
    }
    match (as_object(before), as_object(after)) {
        (Some(b), Some(a)) => {
            let keys: BTreeSet<&String> = b.iter().chain(a.iter()).flat_map(|m| m.keys()).collect();
            for key in keys {
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                diff_paths(
                    &child,
                    b.and_then(|m| m.get(key)),
                    a.and_then(|m| m.get(key)),
                    out,
                );
            }
        }
        _ => {
            out.insert(path.to_owned());
        }
    }
}

/// `Some(None)` for absent, `Some(map)` for an object, `None` for anything else.
fn as_object(value: Option<&Value>) -> Option<Option<&serde_json::Map<String, Value>>> {
    match value {
        None => Some(None),
        Some(Value::Object(map)) => Some(Some(map)),
        Some(_) => None,
    }
}

fn audit_entry(row: HistoryRow) -> AuditEntry {
    let changed_fields = changed_fields(&row.entry, row.previous.as_ref());
    AuditEntry {
        revision: row.entry.revision,
        server_id: row.server_id,
        kind: row.entry.kind,
        actor: row.entry.actor,
        source: row.entry.source,
        at: row.entry.at,
        previous_revision: row.previous.map(|p| p.revision),
        changed_fields,
    }
}

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
            approval_ttl: crate::approvals::DEFAULT_APPROVAL_TTL,
            approval_max_pending: crate::approvals::DEFAULT_MAX_PENDING_PER_CALLER,
            approval_retention: crate::approvals::DEFAULT_APPROVAL_RETENTION,
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
    /// [`crate::approvals::DEFAULT_APPROVAL_TTL`].
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

    /// A page of the audit trail: registry changes of every record (or of
    /// one) from the never-compacted history, each with the paths of the
    /// fields it changed.
    pub async fn audit(&self, query: &AuditQuery) -> Result<AuditPage, RegistryError> {
        let limit = query.limit.clamp(1, AUDIT_MAX_LIMIT);
        let server_id = query.server_id.as_deref();
        // One row more than asked tells whether there are more.
        let page = match query.since_revision {
            None => HistoryPage::Newest {
                server_id,
                limit: limit + 1,
            },
            Some(after) => HistoryPage::After {
                after,
                server_id,
                limit: limit + 1,
            },
        };
        let mut rows = self.store.history_page(page).await?;
        let head_revision = self.store.head().await?.revision;
        let more = rows.len() > limit as usize;
        rows.truncate(limit as usize);
        let entries: Vec<AuditEntry> = rows.into_iter().map(audit_entry).collect();
        let (order, next_since_revision) = match query.since_revision {
            None => ("newest_first", entries.first().map_or(0, |e| e.revision)),
            Some(since) => ("oldest_first", entries.last().map_or(since, |e| e.revision)),
        };
        Ok(AuditPage {
            order,
            head_revision,
            entries,
            more,
            next_since_revision,
        })
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
            Some(dir) => crate::policies_dir::reconcile(self.store.as_ref(), dir)
                .await
                .map(Some),
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

#[cfg(test)]
mod tests {
    use quiver_model::{HttpConfig, StdioConfig, Transport};

    use super::*;

    fn stdio(id: &str) -> McpServerSpec {
        let mut spec = McpServerSpec::new(id, Transport::Stdio);
        spec.stdio = Some(StdioConfig {
            command: "npx".into(),
            env: [("API_KEY".to_owned(), "sk-one".to_owned())].into(),
            ..Default::default()
        });
        spec
    }

    fn entry(revision: u64, spec: Option<McpServerSpec>, source: Source) -> HistoryEntry {
        HistoryEntry {
            revision,
            kind: if spec.is_some() {
                ChangeKind::Upsert
            } else {
                ChangeKind::Delete
            },
            spec,
            at: Utc::now(),
            actor: "ann".into(),
            source,
        }
    }

    #[test]
    fn nested_fields_are_named_by_path_without_values() {
        let before = stdio("a");
        let mut after = before.clone();
        after.budgets.max_concurrency = 2;
        after.display_name = Some("A".into());
        after.labels.insert("team".into(), "infra".into());
        if let Some(stdio) = after.stdio.as_mut() {
            stdio.env.insert("API_KEY".into(), "sk-two".into());
            stdio.env.insert("NEW".into(), "sk-new".into());
            stdio.args = vec!["-y".into()];
        }
        let fields = spec_changes(&before, &after);
        assert_eq!(
            fields,
            [
                "budgets.max_concurrency",
                "display_name",
                "labels.team",
                "stdio.args",
                "stdio.env.API_KEY",
                "stdio.env.NEW",
            ]
        );
        assert!(fields.iter().all(|f| !f.contains("sk-")));
        assert!(spec_changes(&before, &before).is_empty());
    }

    #[test]
    fn resource_and_prompt_lists_are_changed_fields() {
        let before = stdio("a");
        let mut after = before.clone();
        after.allowed_resources = vec!["ui://*".into()];
        after.allowed_prompts = vec!["greet".into()];
        assert_eq!(
            spec_changes(&before, &after),
            ["allowed_prompts", "allowed_resources"]
        );
        let mut widened = after.clone();
        widened.allowed_resources = vec!["file:///*".into(), "ui://*".into()];
        assert_eq!(spec_changes(&after, &widened), ["allowed_resources"]);
    }

    #[test]
    fn a_transport_switch_names_both_sides() {
        let before = stdio("a");
        let mut after = McpServerSpec::new("a", Transport::StreamableHttp);
        after.http = Some(HttpConfig {
            url: "https://mcp.example/mcp".into(),
            headers: [("Authorization".to_owned(), "Bearer x".to_owned())].into(),
            auth_ref: None,
        });
        assert_eq!(
            spec_changes(&before, &after),
            [
                "http.headers.Authorization",
                "http.url",
                "stdio.command",
                "stdio.env.API_KEY",
                "transport",
            ]
        );
    }

    #[test]
    fn creations_deletes_and_source_changes_are_marked() {
        let first = entry(1, Some(stdio("a")), Source::Admin);
        assert_eq!(changed_fields(&first, None), [CREATED_MARKER]);
        let deleted = entry(2, None, Source::Admin);
        assert_eq!(changed_fields(&deleted, Some(&first)), [DELETED_MARKER]);
        let again = entry(3, Some(stdio("a")), Source::Api);
        assert_eq!(changed_fields(&again, Some(&deleted)), [CREATED_MARKER]);
        let adopted = entry(4, Some(stdio("a")), Source::File("a.toml".into()));
        assert_eq!(changed_fields(&adopted, Some(&again)), [SOURCE_MARKER]);
    }
}
