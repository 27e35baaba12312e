//! One-off connections: connect, `initialize`, list every tool, close. The
//! registry's "test connection" / tool preview (docs/reference.md R-UI-3) uses this, so a
//! preview goes through the same connection code as a worker's pool (stdio
//! child in its own process group, streamable HTTP, legacy SSE) and fails the
//! way a worker would.

use std::time::{Duration, Instant};

use quiver_model::McpServerSpec;
use rmcp::model::{Implementation, Tool};
use tokio::time::timeout_at;

use crate::connection::{ClientSide, ConnectSettings, Connection, StderrTail};
use crate::egress::EgressPolicy;
use crate::error::McpError;
use crate::launch::{EnvLookup, launch};
use crate::listing::ListLimits;
use crate::server_log::ServerLog;

/// How long a failed or closed stdio child's last stderr lines are awaited.
const STDERR_DRAIN: Duration = Duration::from_millis(500);

/// What a probe found.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The server's `initialize` answer about itself, when it sent one.
    pub server_info: Option<Implementation>,
    /// Every tool, all pages of `tools/list` followed.
    pub tools: Vec<Tool>,
    /// Time from the start of the probe until the tool list was complete.
    pub duration: Duration,
    /// The last lines the stdio child wrote to stderr (empty for HTTP).
    pub stderr_tail: Vec<String>,
}

/// The step a probe was at when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeStep {
    /// Resolving `${ENV:…}` references into what to start or connect to.
    Launch,
    /// Spawning or connecting plus the `initialize` handshake.
    Initialize,
    /// `tools/list`, every page.
    ListTools,
}

impl ProbeStep {
    /// The step as it reads in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeStep::Launch => "launch",
            ProbeStep::Initialize => "initialize",
            ProbeStep::ListTools => "tools/list",
        }
    }
}

/// Why a probe failed. The connection, if one was made, is closed either way.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProbeError {
    /// The server could not be started, reached or initialized, or answered
    /// `tools/list` with an error.
    #[error("{step}: {message}", step = .step.as_str())]
    Unavailable {
        /// Where it failed.
        step: ProbeStep,
        /// What went wrong.
        message: String,
        /// The last lines the stdio child wrote to stderr.
        stderr_tail: Vec<String>,
    },
    /// The egress allowlist refuses the record's URL (nothing was
    /// connected): the answer a worker gives, `mcp_policy_denied`.
    #[error("{step}: {message}", step = .step.as_str())]
    PolicyDenied {
        /// [`ProbeStep::Launch`] for a host refused by itself,
        /// [`ProbeStep::Initialize`] for one refused once resolved.
        step: ProbeStep,
        /// Which host and how to allow it.
        message: String,
    },
    /// The probe's deadline passed.
    #[error("{step} did not complete within {} ms", .after.as_millis(), step = .step.as_str())]
    Timeout {
        /// The step that was still running.
        step: ProbeStep,
        /// The deadline, counted from the start of the probe.
        after: Duration,
        /// The last lines the stdio child wrote to stderr.
        stderr_tail: Vec<String>,
    },
}

impl ProbeError {
    /// The last lines the stdio child wrote to stderr.
    pub fn stderr_tail(&self) -> &[String] {
        match self {
            ProbeError::Unavailable { stderr_tail, .. }
            | ProbeError::Timeout { stderr_tail, .. } => stderr_tail,
            ProbeError::PolicyDenied { .. } => &[],
        }
    }

    /// A failed step: an egress refusal is [`ProbeError::PolicyDenied`].
    fn failed(step: ProbeStep, err: McpError, stderr_tail: Vec<String>) -> Self {
        match err {
            McpError::EgressDenied(message) => ProbeError::PolicyDenied { step, message },
            other => ProbeError::Unavailable {
                step,
                message: other.to_string(),
                stderr_tail,
            },
        }
    }
}

/// Connects to `spec`'s server, initializes, lists every tool and closes
/// again, all of connect, `initialize` and `tools/list` within `deadline`.
///
/// `${ENV:…}` references resolve through `env` (the caller's environment, for
/// the registry its own). A stdio child is always ended with its whole
/// process group before this returns, whatever the outcome; when this future
/// is dropped early, the transport's drop kills the group instead, so callers
/// that must not be cancelled half-way should run it in a task of its own.
pub async fn probe(
    spec: &McpServerSpec,
    env: &EnvLookup,
    http: reqwest::Client,
    deadline: Duration,
) -> Result<Probe, ProbeError> {
    probe_with_egress(spec, env, http, &EgressPolicy::default(), None, deadline).await
}

/// [`probe`] under an egress allowlist. Nothing refused is connected to: a
/// URL refused by its host alone fails at [`ProbeStep::Launch`], a host name
/// whose resolved addresses are refused at [`ProbeStep::Initialize`].
/// Records with `http.auth_ref` take their bearer tokens from `credentials`.
pub async fn probe_with_egress(
    spec: &McpServerSpec,
    env: &EnvLookup,
    http: reqwest::Client,
    egress: &EgressPolicy,
    credentials: Option<std::sync::Arc<dyn crate::credentials::CredentialSource>>,
    deadline: Duration,
) -> Result<Probe, ProbeError> {
    let started = Instant::now();
    let until = tokio::time::Instant::now() + deadline;
    let stderr = StderrTail::default();
    let launch = launch(spec, env).and_then(|launch| egress.check_launch(&launch).map(|()| launch));
    let launch = launch.map_err(|err| ProbeError::failed(ProbeStep::Launch, err, Vec::new()))?;
    let settings = ConnectSettings {
        // The outer deadline is the bound; this one only must not fire first,
        // so that running out of time reads as a timeout, not a failure.
        initialize_timeout: deadline + Duration::from_secs(1),
        max_message_bytes: crate::stdio::DEFAULT_MAX_MESSAGE_BYTES,
        http,
        max_concurrent_requests: 1,
        protocol: spec.protocol,
        egress: egress.clone(),
        credentials: credentials.clone(),
        // A probe acts for nobody: fleet-wide grants only.
        principal: None,
    };
    let timeout = |step, stderr_tail| ProbeError::Timeout {
        step,
        after: deadline,
        stderr_tail,
    };
    let side = ClientSide::standalone(ServerLog::new(&spec.server_id));
    let connection = match timeout_at(
        until,
        Connection::open(&launch, &settings, &stderr, &side, None),
    )
    .await
    {
        Ok(Ok(connection)) => connection,
        outcome => {
            // The transport was dropped with the connect future: its drop
            // kills the child's group; give the pipe a moment to deliver.
            stderr.drained(STDERR_DRAIN).await;
            let tail = stderr.lines();
            return Err(match outcome {
                Ok(Err(err)) => ProbeError::failed(ProbeStep::Initialize, err, tail),
                _ => timeout(ProbeStep::Initialize, tail),
            });
        }
    };
    // Paged within the pool's default listing bounds, so a server that
    // pages without end fails the preview with the limit it hit. As above,
    // the outer deadline is the bound of time.
    let limits = ListLimits {
        timeout: deadline + Duration::from_secs(1),
        ..ListLimits::DEFAULT
    };
    let listed = timeout_at(
        until,
        limits.list_tools(connection.peer(), |err| {
            crate::error::McpError::Unavailable(err.to_string())
        }),
    )
    .await;
    let duration = started.elapsed();
    let server_info = connection
        .peer()
        .peer_info()
        .and_then(|info| info.server_info.clone());
    connection.close().await;
    stderr.drained(STDERR_DRAIN).await;
    let stderr_tail = stderr.lines();
    match listed {
        Ok(Ok(tools)) => Ok(Probe {
            server_info,
            tools,
            duration,
            stderr_tail,
        }),
        Ok(Err(err)) => Err(ProbeError::Unavailable {
            step: ProbeStep::ListTools,
            message: err.to_string(),
            stderr_tail,
        }),
        Err(_) => Err(timeout(ProbeStep::ListTools, stderr_tail)),
    }
}
