//! Why a task policy or session filter cannot be used: [`PolicyError`], each
//! variant naming the offending field.

use crate::budget::BudgetError;
use crate::pattern::PatternError;
use crate::rate_limit::RateLimitError;
use crate::tool_search::ToolSearchError;

/// A task policy or session filter that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A pattern does not compile.
    #[error("{field}: {error}")]
    InvalidPattern {
        /// The offending entry, e.g. `tool_allowlist[2]`.
        field: String,
        /// What is wrong with the pattern.
        error: PatternError,
    },
    /// A listed server id is not a valid server id.
    #[error("{field}: {server_id:?} is not a valid server id (^[A-Za-z0-9][A-Za-z0-9_-]{{0,63}}$)")]
    InvalidServerId {
        /// The offending entry, e.g. `server_ids[0]`.
        field: String,
        /// The id as given, shortened when very long.
        server_id: String,
    },
    /// A default server is outside the task's allowed servers.
    #[error("{field}: server {server_id:?} is not in allowed_server_ids")]
    DefaultNotAllowed {
        /// The offending entry, e.g. `default_server_ids[1]`.
        field: String,
        /// The server id.
        server_id: String,
    },
    /// A model name is empty.
    #[error("{field}: must not be empty")]
    EmptyModel {
        /// `model` or `models.<requested>`.
        field: String,
    },
    /// A session budget is invalid or above the task's.
    #[error("budgets.{0}")]
    Budget(#[from] BudgetError),
    /// `tool_search.max_tools` is out of range.
    #[error("tool_search.max_tools: {0}")]
    ToolSearch(#[from] ToolSearchError),
    /// A rate limit or `max_concurrent_calls` is invalid.
    #[error(transparent)]
    RateLimit(#[from] RateLimitError),
    /// The request names servers the task does not allow; a request cannot
    /// widen the task policy.
    #[error(
        "server_ids: {} not allowed for this caller; the request cannot widen the task policy",
        list_ids(.server_ids)
    )]
    ServersNotAllowed {
        /// The servers named by the request but not allowed, sorted.
        server_ids: Vec<String>,
    },
}

impl PolicyError {
    /// The field this error is about.
    pub fn field(&self) -> &str {
        match self {
            PolicyError::InvalidPattern { field, .. }
            | PolicyError::InvalidServerId { field, .. }
            | PolicyError::DefaultNotAllowed { field, .. }
            | PolicyError::EmptyModel { field } => field,
            PolicyError::ServersNotAllowed { .. } => "server_ids",
            PolicyError::Budget(error) => error.field(),
            PolicyError::ToolSearch(_) => "tool_search.max_tools",
            PolicyError::RateLimit(error) => &error.field,
        }
    }
}

fn list_ids(ids: &[String]) -> String {
    let quoted: Vec<String> = ids.iter().map(|id| format!("{id:?}")).collect();
    match quoted.len() {
        1 => format!("server {} is", quoted[0]),
        _ => format!("servers {} are", quoted.join(", ")),
    }
}
