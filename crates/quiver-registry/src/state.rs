//! State shared by the gRPC and REST front ends, and the write operations
//! both use (so auditing and metrics happen in one place).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use quiver_bootstrap::{ApplyReport, Scan};
use quiver_mcp::launch::{EnvLookup, process_env};
use quiver_model::{HistoryEntry, McpServerSpec, Strictness};
use quiver_store::{DeleteRequest, Store, UpsertOutcome, UpsertRequest};
use tokio::sync::Mutex;

use crate::auth::Authenticator;
use crate::error::RegistryError;
use crate::feed::ChangeFeed;
use crate::workers::WorkerBoard;

/// Actor recorded for changes made by `mcp.d` rescans.
pub const BOOTSTRAP_ACTOR: &str = "mcp.d";

/// Bound on connecting to an MCP server plus `initialize` and `tools/list`
/// in a tool preview.
pub const PREVIEW_TIMEOUT: Duration = Duration::from_secs(20);

/// How often a write that restores masked values re-reads the record when
/// other writers keep changing it in between.
const MASKED_WRITE_ATTEMPTS: usize = 5;

/// The `mcp.d` directory the registry reconciles from.
#[derive(Debug, Clone)]
pub struct McpDir {
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
    mcp_dir: Option<McpDir>,
    /// Serialises rescans (SIGHUP, timer and REST may overlap).
    rescan_lock: Arc<Mutex<()>>,
    preview_timeout: Duration,
    preview_env: PreviewEnv,
    preview_egress: quiver_mcp::egress::EgressPolicy,
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

/// Result of one `mcp.d` rescan.
#[derive(Debug)]
pub struct RescanOutcome {
    /// What the scan found (records, per-file errors, warnings).
    pub scan: Scan,
    /// What was written.
    pub report: ApplyReport,
}

impl RegistryState {
    /// Assembles the state.
    pub fn new(
        store: Arc<dyn Store>,
        feed: ChangeFeed,
        auth: Authenticator,
        mcp_dir: Option<McpDir>,
    ) -> Self {
        RegistryState {
            store,
            feed,
            auth,
            workers: WorkerBoard::default(),
            mcp_dir,
            rescan_lock: Arc::new(Mutex::new(())),
            preview_timeout: PREVIEW_TIMEOUT,
            preview_env: PreviewEnv::default(),
            preview_egress: quiver_mcp::egress::EgressPolicy::default(),
        }
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
    pub async fn restore_masked(
        &self,
        mut spec: McpServerSpec,
    ) -> Result<McpServerSpec, RegistryError> {
        if spec.has_masked_values() {
            let stored = self.store.get(&spec.server_id).await?;
            spec.restore_masked(stored.as_ref().map(|s| &s.spec))?;
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
            spec.restore_masked(stored.as_ref().map(|s| &s.spec))?;
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

    /// Upserts with audit logging and metrics.
    pub async fn upsert(&self, request: UpsertRequest) -> Result<UpsertOutcome, RegistryError> {
        let actor = request.actor.clone();
        let source = request.source.to_string();
        let outcome = self
            .store
            .upsert(request)
            .await
            .map_err(|err| count_write_error(err.into()))?;
        if !matches!(outcome, UpsertOutcome::Unchanged(_)) {
            let server = outcome.server();
            metrics::counter!("quiver_registry_upserts_total").increment(1);
            tracing::info!(
                target: "quiver::audit",
                action = "upsert",
                server_id = %server.spec.server_id,
                revision = server.revision,
                actor = %actor,
                source = %source,
                "registry change"
            );
        }
        Ok(outcome)
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

    /// Reconciles the store with the `mcp.d` directory.
    pub async fn rescan(&self) -> Result<RescanOutcome, RegistryError> {
        let dir = self.mcp_dir.as_ref().ok_or_else(|| {
            RegistryError::FailedPrecondition("no mcp.d directory is configured (--mcp-dir)".into())
        })?;
        let _serialised = self.rescan_lock.lock().await;
        let (scan, report) = quiver_bootstrap::reconcile(
            self.store.as_ref(),
            &dir.path,
            dir.strictness,
            BOOTSTRAP_ACTOR,
        )
        .await
        .map_err(|err| RegistryError::FailedPrecondition(err.to_string()))?;
        tracing::info!(dir = %dir.path.display(), report = %report, "mcp.d rescanned");
        Ok(RescanOutcome { scan, report })
    }

    /// Whether an `mcp.d` directory is configured.
    pub fn has_mcp_dir(&self) -> bool {
        self.mcp_dir.is_some()
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
fn count_write_error(err: RegistryError) -> RegistryError {
    metrics::counter!("quiver_registry_write_errors_total", "code" => err.code().as_str())
        .increment(1);
    err
}
