//! The e2e stack: a `quiver registry` process, its admin API and a `quiver
//! worker` process following it, all with the e2e tokens, built by
//! [`Stack::builder`] with what a test varies (database, records, worker
//! config and arguments, a scripted chat upstream). Tests that need more
//! workers on the same registry add them with [`Stack::start_worker`].

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use quiver_testkit::postgres::TestDatabase;
use quiver_testkit::upstream::{Script, ScriptedUpstream};
use serde_json::Value;
use tempfile::TempDir;

use crate::harness::{ADMIN, Admin, CALLER, RegistryProcess, WORKER, WorkerProcess, registry};

/// How long a stack waits for its worker to catch up with the registry.
const SYNC_TIMEOUT: Duration = Duration::from_secs(10);

/// A registry process, its admin API and a worker process following it.
pub struct Stack {
    /// The registry.
    pub registry: RegistryProcess,
    /// The registry's admin REST API.
    pub admin: Admin,
    /// The worker, shared so that tasks can call it while the test goes on.
    pub worker: Arc<WorkerProcess>,
    upstream: Option<ScriptedUpstream>,
    db_url: String,
    /// Dropped after the processes (fields drop in order): the database
    /// outlives the registry using it.
    _postgres: Option<TestDatabase>,
    dir: TempDir,
}

/// What a [`Stack`] is started with; see [`Stack::builder`].
pub struct StackBuilder {
    dir: TempDir,
    postgres: bool,
    records: Vec<Value>,
    worker_config: Option<String>,
    worker_args: Vec<String>,
    upstream: Option<Script>,
    tools_listed: usize,
}

impl Stack {
    /// A stack on a fresh SQLite database with no records and a worker
    /// with no config file, unless the builder says otherwise.
    pub fn builder() -> StackBuilder {
        StackBuilder {
            dir: tempfile::tempdir().expect("temp dir"),
            postgres: false,
            records: Vec::new(),
            worker_config: None,
            worker_args: Vec::new(),
            upstream: None,
            tools_listed: 0,
        }
    }

    /// Waits (at most 10 s) until the worker's snapshot is at `revision` and
    /// not degraded.
    pub async fn synced(&self, revision: u64) {
        self.worker.synced(revision, SYNC_TIMEOUT).await;
    }

    /// Upserts `record` and waits until the worker holds it; returns the
    /// new revision.
    pub async fn upsert(&self, record: Value) -> u64 {
        let revision = self.admin.upsert(record).await;
        self.synced(revision).await;
        revision
    }

    /// Another worker following the registry with the e2e tokens and
    /// `args` (it holds a first snapshot when this returns).
    pub async fn start_worker(&self, args: &[&str]) -> WorkerProcess {
        WorkerProcess::start(&self.registry.grpc_url(), WORKER, CALLER, args).await
    }

    /// Once the registry has stopped (killed or terminated): a new registry
    /// on the same database and gRPC address, as after a process restart,
    /// and its admin API.
    pub async fn restart_registry(&mut self) {
        let grpc = self.registry.grpc_addr();
        self.registry = registry(&self.db_url, Some(grpc)).await;
        self.admin = Admin::new(&self.registry, ADMIN);
    }

    /// The worker process itself, to stop or inspect it.
    ///
    /// # Panics
    /// While a clone of [`Stack::worker`] is held elsewhere.
    pub fn worker_mut(&mut self) -> &mut WorkerProcess {
        Arc::get_mut(&mut self.worker).expect("the worker is not shared any more")
    }

    /// The scripted chat upstream of the worker.
    ///
    /// # Panics
    /// If the stack was built without [`StackBuilder::upstream`].
    pub fn upstream(&self) -> &ScriptedUpstream {
        self.upstream
            .as_ref()
            .expect("the stack was built with an upstream")
    }

    /// The stack's temporary directory (see [`StackBuilder::dir`]).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl StackBuilder {
    /// The stack's temporary directory, which lives as long as the stack:
    /// its SQLite database and worker config are there, and a test may put
    /// its own files there (in a subdirectory if it lists its contents).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A fresh PostgreSQL database (dropped with the stack) instead of
    /// SQLite.
    pub fn postgres(mut self) -> Self {
        self.postgres = true;
        self
    }

    /// `record` (a `mcp.d` record as JSON) is upserted before the worker
    /// starts; the stack is started once the worker holds every record.
    pub fn record(mut self, record: Value) -> Self {
        self.records.push(record);
        self
    }

    /// `toml` is the worker's config file (`--config`).
    pub fn worker_config(mut self, toml: &str) -> Self {
        self.worker_config = Some(toml.to_owned());
        self
    }

    /// `args` are added to the worker's command line.
    pub fn worker_args(mut self, args: &[&str]) -> Self {
        self.worker_args
            .extend(args.iter().map(|arg| (*arg).to_owned()));
        self
    }

    /// A scripted OpenAI-compatible upstream playing `script` is the
    /// worker's chat upstream (`--upstream-url`); see [`Stack::upstream`].
    pub fn upstream(mut self, script: Script) -> Self {
        self.upstream = Some(script);
        self
    }

    /// The stack is started once the worker lists at least `count` tools
    /// (its servers were reached, not only its records received).
    pub fn tools_listed(mut self, count: usize) -> Self {
        self.tools_listed = count;
        self
    }

    /// Starts the processes and waits until the worker is ready.
    pub async fn start(self) -> Stack {
        let (postgres, db_url) = if self.postgres {
            let db = TestDatabase::create().await;
            let url = db.url().to_owned();
            (Some(db), url)
        } else {
            let path = self.dir.path().join("quiver.db");
            (None, format!("sqlite://{}", path.display()))
        };
        let registry = registry(&db_url, None).await;
        let admin = Admin::new(&registry, ADMIN);
        let mut head = None;
        for record in self.records {
            head = Some(admin.upsert(record).await);
        }
        let upstream = match self.upstream {
            Some(script) => Some(ScriptedUpstream::start(script).await),
            None => None,
        };
        let mut args = Vec::new();
        if let Some(toml) = self.worker_config {
            let path = self.dir.path().join("worker.toml");
            std::fs::write(&path, toml).expect("worker config");
            args.extend(["--config".to_owned(), path.display().to_string()]);
        }
        if let Some(upstream) = &upstream {
            args.extend(["--upstream-url".to_owned(), upstream.base_url()]);
        }
        args.extend(self.worker_args);
        let worker = WorkerProcess::start(&registry.grpc_url(), WORKER, CALLER, &args).await;
        let stack = Stack {
            registry,
            admin,
            worker: Arc::new(worker),
            upstream,
            db_url,
            _postgres: postgres,
            dir: self.dir,
        };
        if let Some(head) = head {
            stack.synced(head).await;
        }
        if self.tools_listed > 0 {
            let count = self.tools_listed;
            crate::harness::eventually(SYNC_TIMEOUT, &format!("{count} tools listed"), || async {
                (stack.worker.tools().await.len() >= count).then_some(())
            })
            .await;
        }
        stack
    }
}
