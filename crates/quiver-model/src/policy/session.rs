//! The session layer (layer 3): the caller's per-request choices, which can
//! only narrow what the task allows.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::error::PolicyError;
use super::patterns::NamedPatterns;
use super::reject::RejectReason;
use super::task::{CompiledTaskPolicy, server_id_set};

/// The caller's per-request choices (layer 3): the `mcp` extension of a chat
/// request without its `enabled` flag.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionFilter {
    /// Servers to use; `None` means the task's defaults, an empty list means
    /// none. Naming a server the task does not allow is an error, see
    /// [`check_session_within_task`].
    pub server_ids: Option<Vec<String>>,
    /// Patterns over `<server_id>.<tool_name>`; empty: no further narrowing.
    pub tool_allowlist: Vec<String>,
    /// Patterns over `<server_id>.<tool_name>` that always remove.
    pub tool_denylist: Vec<String>,
}

impl SessionFilter {
    /// Checks and compiles the filter; errors name the offending field.
    pub fn compile(&self) -> Result<CompiledSessionFilter, PolicyError> {
        Ok(CompiledSessionFilter {
            server_ids: server_id_set("server_ids", &self.server_ids)?,
            allowlist: NamedPatterns::for_field("tool_allowlist", &self.tool_allowlist)?,
            denylist: NamedPatterns::for_field("tool_denylist", &self.tool_denylist)?,
        })
    }
}

/// A checked [`SessionFilter`].
#[derive(Debug, Clone)]
pub struct CompiledSessionFilter {
    pub(super) server_ids: Option<BTreeSet<String>>,
    allowlist: NamedPatterns,
    denylist: NamedPatterns,
}

impl CompiledSessionFilter {
    /// The session's tool patterns as written: (allowlist, denylist). Two
    /// filters with the same patterns decide every tool alike.
    pub fn tool_patterns(&self) -> (&[String], &[String]) {
        (&self.allowlist.patterns, &self.denylist.patterns)
    }

    pub(super) fn check_tool(&self, qualified: &str) -> Result<(), RejectReason> {
        if let Some(pattern) = self.denylist.first_match(qualified) {
            return Err(RejectReason::DeniedBySession { pattern });
        }
        if !self.allowlist.is_empty() && !self.allowlist.matches(qualified) {
            return Err(RejectReason::NotInSessionAllowlist);
        }
        Ok(())
    }
}

/// Refuses a session that names servers the task does not allow.
///
/// [`server_selected`](super::server_selected) already keeps such servers out; this makes the attempt
/// visible so the chat layer can refuse the request (403) instead of quietly
/// using fewer servers than asked for.
pub fn check_session_within_task(
    task: &CompiledTaskPolicy,
    session: &CompiledSessionFilter,
) -> Result<(), PolicyError> {
    let Some(requested) = &session.server_ids else {
        return Ok(());
    };
    let refused: Vec<String> = requested
        .iter()
        .filter(|id| !task.allows_server(id))
        .cloned()
        .collect();
    if refused.is_empty() {
        Ok(())
    } else {
        Err(PolicyError::ServersNotAllowed {
            server_ids: refused,
        })
    }
}
