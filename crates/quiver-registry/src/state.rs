//! State shared by the gRPC and REST front ends, and the write operations
//! both use (so auditing and metrics happen in one place).

use std::path::PathBuf;
use std::sync::Arc;

use quiver_bootstrap::{ApplyReport, Scan};
use quiver_model::{HistoryEntry, Strictness};
use quiver_store::{DeleteRequest, Store, UpsertOutcome, UpsertRequest};
use tokio::sync::Mutex;

use crate::auth::Authenticator;
use crate::error::RegistryError;
use crate::feed::ChangeFeed;
use crate::workers::WorkerBoard;

/// Actor recorded for changes made by `mcp.d` rescans.
pub const BOOTSTRAP_ACTOR: &str = "mcp.d";

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
        }
    }

    /// Upserts with audit logging and metrics.
    pub async fn upsert(&self, request: UpsertRequest) -> Result<UpsertOutcome, RegistryError> {
        let actor = request.actor.clone();
        let source = request.source.to_string();
        let outcome = self.store.upsert(request).await?;
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
        let revision = self.store.delete(request).await?;
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
