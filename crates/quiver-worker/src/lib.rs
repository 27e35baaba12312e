//! The Quiver data plane: follows the registry (`quiver-sync`), keeps warm,
//! budgeted MCP connections (`quiver-mcp`), decides per caller which tools
//! may be used (`quiver_model::policy`) and serves the direct tool API.

pub mod approval;
pub mod artifacts;
pub mod audit;
pub mod auth;
pub mod call;
pub mod call_error;
pub mod caller;
pub mod catalog;
pub mod chat;
pub mod error;
pub mod gateway;
pub mod health;
pub mod http;
pub mod limits;
pub mod oauth_tokens;
pub mod quota;
pub mod registry_callers;
pub mod schema;
mod service;
pub mod tool_search;
pub mod usage;

pub use service::{DEFAULT_CATALOG_WAIT, DEFAULT_HTTP_LISTEN, Worker, WorkerError, WorkerOptions};
