//! The worker's MCP clients (docs/reference.md §7): a pool of warm, budgeted connections
//! over the official `rmcp` SDK on three transports — stdio child processes,
//! streamable HTTP, and the legacy HTTP+SSE transport ([`legacy_sse`],
//! implemented here as an rmcp transport, since rmcp no longer ships one).

mod client_side;
pub mod connection;
pub mod credentials;
mod direct_call;
mod dropped;
pub mod egress;
mod error;
mod inflight;
mod json_scan;
pub mod launch;
pub mod leases;
pub mod legacy_sse;
pub mod lifecycle;
mod listing;
pub mod oauth;
pub mod output;
mod peer_events;
mod pool;
pub mod probe;
mod process_tree;
pub mod relay;
pub mod server_log;
mod sse_answer;
mod stdio;
mod tools;

pub use error::{AuthorizationRequired, McpError};
pub use pool::{
    CallOptions, CallOutcome, ForwardError, HealthState, McpPool, PoolOptions, ServerHealth,
    UpstreamInput, forwarded_meta, is_forwarded_meta_key,
};
pub use rmcp::model::{CallToolResult, ContentBlock, JsonObject, ResourceContents, Tool};
