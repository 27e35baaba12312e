//! Approvals (docs/reference.md §13.7): a one-time permission for one call,
//! bound to the caller's task, the server, the tool, the call's arguments
//! and the record revision, kept by the registry so every worker honours it.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{MASK, is_secret_parameter};

/// The lowercase hex SHA-256 of the canonical JSON of a call's arguments.
///
/// Canonical JSON: object keys sorted (by their UTF-8 bytes) at every depth,
/// no whitespace, strings and numbers as `serde_json` writes them. Two
/// argument objects that differ only in key order or formatting therefore
/// hash the same; any other difference changes the hash.
pub fn canonical_arguments_hash(arguments: &serde_json::Value) -> String {
    let mut canonical = String::new();
    write_canonical(arguments, &mut canonical);
    let digest = Sha256::digest(canonical.as_bytes());
    hex::encode(digest)
}

fn write_canonical(value: &serde_json::Value, out: &mut String) {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (index, (key, item)) in entries.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
        serde_json::Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// Where an approval stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalState {
    /// Requested, waiting for an approver.
    Pending,
    /// Approved; the bound call may run once.
    Approved,
    /// Denied by an approver.
    Denied,
    /// Approved and consumed by its one call.
    Used,
    /// Passed its expiry before it was used (or decided).
    Expired,
}

impl ApprovalState {
    /// Every state, in the order lists and metrics show them.
    pub const ALL: [ApprovalState; 5] = [
        ApprovalState::Pending,
        ApprovalState::Approved,
        ApprovalState::Denied,
        ApprovalState::Used,
        ApprovalState::Expired,
    ];

    /// The wire and database name.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalState::Pending => "pending",
            ApprovalState::Approved => "approved",
            ApprovalState::Denied => "denied",
            ApprovalState::Used => "used",
            ApprovalState::Expired => "expired",
        }
    }
}

impl fmt::Display for ApprovalState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is no [`ApprovalState`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown approval state {0:?}: expected pending, approved, denied, used or expired")]
pub struct UnknownApprovalState(pub String);

impl FromStr for ApprovalState {
    type Err = UnknownApprovalState;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        ApprovalState::ALL
            .into_iter()
            .find(|state| state.as_str() == text)
            .ok_or_else(|| UnknownApprovalState(text.to_owned()))
    }
}

/// An approver's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalDecision {
    /// Let the call run once.
    Approve,
    /// Refuse the call.
    Deny,
}

impl ApprovalDecision {
    /// The state a pending approval moves to.
    pub fn state(self) -> ApprovalState {
        match self {
            ApprovalDecision::Approve => ApprovalState::Approved,
            ApprovalDecision::Deny => ApprovalState::Denied,
        }
    }
}

/// What a call that wants to use an approval must match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalBinding {
    /// The caller's task (its identity as the worker saw it).
    pub task: String,
    /// The MCP server record.
    pub server_id: String,
    /// The tool name as the caller called it.
    pub tool: String,
    /// [`canonical_arguments_hash`] of the call's arguments.
    pub arguments_hash: String,
    /// The record revision the call ran against.
    pub record_revision: u64,
}

/// Which bound field of an approval a call did not match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BindingField {
    /// Another task.
    Task,
    /// Another server.
    ServerId,
    /// Another tool.
    Tool,
    /// Other arguments.
    ArgumentsHash,
    /// Another record revision.
    RecordRevision,
}

impl BindingField {
    /// Every bound field, in the order a mismatch is looked for.
    pub const ALL: [BindingField; 5] = [
        BindingField::Task,
        BindingField::ServerId,
        BindingField::Tool,
        BindingField::ArgumentsHash,
        BindingField::RecordRevision,
    ];

    /// The field's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            BindingField::Task => "task",
            BindingField::ServerId => "server_id",
            BindingField::Tool => "tool",
            BindingField::ArgumentsHash => "arguments_hash",
            BindingField::RecordRevision => "record_revision",
        }
    }
}

impl ApprovalBinding {
    /// The first field in which `call` differs from this binding.
    pub fn mismatch(&self, call: &ApprovalBinding) -> Option<BindingField> {
        if self.task != call.task {
            Some(BindingField::Task)
        } else if self.server_id != call.server_id {
            Some(BindingField::ServerId)
        } else if self.tool != call.tool {
            Some(BindingField::Tool)
        } else if self.arguments_hash != call.arguments_hash {
            Some(BindingField::ArgumentsHash)
        } else if self.record_revision != call.record_revision {
            Some(BindingField::RecordRevision)
        } else {
            None
        }
    }
}

/// Parses a call's arguments from JSON text (the gRPC `arguments_json`).
pub fn arguments_from_json(text: &str) -> Result<serde_json::Value, serde_json::Error> {
    serde_json::from_str(text)
}

/// A call's arguments for display: the value of every object key that
/// looks secret ([`is_secret_parameter`]), at any depth, replaced by [`MASK`].
pub fn masked_arguments(arguments: &serde_json::Value) -> serde_json::Value {
    match arguments {
        serde_json::Value::Object(map) => serde_json::Value::Object(
            map.iter()
                .map(|(key, value)| {
                    let shown = if is_secret_parameter(key) {
                        serde_json::Value::String(MASK.to_owned())
                    } else {
                        masked_arguments(value)
                    };
                    (key.clone(), shown)
                })
                .collect(),
        ),
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.iter().map(masked_arguments).collect())
        }
        scalar => scalar.clone(),
    }
}

/// One approval as the registry keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    /// Random 128-bit id, URL-safe (`apr_` + 32 hex digits).
    pub approval_id: String,
    /// Where it stands.
    pub state: ApprovalState,
    /// The call it is bound to.
    #[serde(flatten)]
    pub binding: ApprovalBinding,
    /// The call's arguments as requested (unmasked; mask before showing).
    pub arguments: serde_json::Value,
    /// Who asked (the worker or admin principal).
    pub requested_by: String,
    /// When it was requested.
    pub requested_at: DateTime<Utc>,
    /// After this it can no longer be decided or used.
    pub expires_at: DateTime<Utc>,
    /// The approver who decided.
    pub decided_by: Option<String>,
    /// When it was decided.
    pub decided_at: Option<DateTime<Utc>>,
    /// The approver's note.
    pub note: Option<String>,
    /// When its call ran.
    pub used_at: Option<DateTime<Utc>>,
    /// Who used it (the worker principal).
    pub used_by: Option<String>,
}

/// What an attempt to use an approval found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UseOutcome {
    /// It was approved and matched: now `used`; the call may run.
    Used,
    /// No approval has this id.
    NotFound,
    /// Not decided yet.
    Pending,
    /// An approver denied it.
    Denied,
    /// Its one use is spent.
    AlreadyUsed,
    /// It expired.
    Expired,
    /// It is approved, but for another call: the field that differs.
    Mismatch(BindingField),
}

impl UseOutcome {
    /// The refusal's name on the wire (`used` when it was not refused).
    pub fn as_str(self) -> &'static str {
        match self {
            UseOutcome::Used => "used",
            UseOutcome::NotFound => "not_found",
            UseOutcome::Pending => "pending",
            UseOutcome::Denied => "denied",
            UseOutcome::AlreadyUsed => "already_used",
            UseOutcome::Expired => "expired",
            UseOutcome::Mismatch(_) => "mismatch",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_and_whitespace_do_not_change_the_hash() {
        let a: serde_json::Value =
            serde_json::from_str(r#"{"b": 1, "a": {"y": [1, {"d": 2, "c": 3}], "x": "s"}}"#)
                .unwrap();
        let b = json!({"a": {"x": "s", "y": [1, {"c": 3, "d": 2}]}, "b": 1});
        assert_eq!(canonical_arguments_hash(&a), canonical_arguments_hash(&b));
        assert_ne!(
            canonical_arguments_hash(&a),
            canonical_arguments_hash(&json!({"a": {"x": "s", "y": [1, {"c": 3, "d": 2}]}, "b": 2}))
        );
    }

    #[test]
    fn hash_is_sha256_of_the_canonical_text() {
        // printf '%s' '{"a":1,"b":"x"}' | sha256sum
        assert_eq!(
            canonical_arguments_hash(&json!({"b": "x", "a": 1})),
            "ecf9e98ec0641e23113ff3ce8bdc78d0ddd249886517fd4a7f68cc83d4e65667"
        );
    }

    #[test]
    fn states_round_trip() {
        for state in ApprovalState::ALL {
            assert_eq!(state.as_str().parse::<ApprovalState>(), Ok(state));
        }
        assert!("nope".parse::<ApprovalState>().is_err());
    }
}
