//! Which tools a request may use (R-FILTER-1/2, R-CHAT-1).
//!
//! Three layers, all of which must pass:
//!
//! 1. the record's `allowed_tools` / `denied_tools` (admin), matched against
//!    the raw MCP tool name; an empty `allowed_tools` allows nothing;
//! 2. the task policy (operator, per caller credential or task), whose
//!    patterns match `<server_id>.<tool_name>`;
//! 3. the session filter (caller, per request), same subject as the task.
//!
//! At the task and session layers an empty allowlist means "no further
//! narrowing"; a deny match always removes. The session can only narrow: it
//! selects servers among those the task allows, and its lists are applied in
//! addition to the task's.
//!
//! [`evaluate`] is the one decision used for the registry's tool preview, the
//! worker's tool listing and the worker's call routing, so the three never
//! disagree.
//!
//! Resources and prompts (served by the planned MCP gateway, docs/reference.md
//! §13.5) have only the record layer so far: [`ServerContentFilter`] compiles
//! `allowed_resources` / `allowed_prompts`, again default deny. Task policies
//! and session filters do not narrow them.

mod error;
mod evaluate;
mod limits;
mod patterns;
mod reject;
mod server;
mod session;
mod task;

pub use error::PolicyError;
pub use evaluate::{Decision, ListedTool, ToolDecision, evaluate, evaluate_tools, server_selected};
pub use limits::{MAX_TOOL_DESCRIPTION_BYTES, MAX_TOOL_SCHEMA_BYTES, MAX_TOOL_SCHEMA_DEPTH};
pub use reject::RejectReason;
pub use server::{ServerContentFilter, ServerToolFilter};
pub use session::{CompiledSessionFilter, SessionFilter, check_session_within_task};
pub use task::{CompiledTaskPolicy, TaskPolicy};

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
