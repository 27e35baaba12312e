//! The Quiver control plane: the gRPC `McpRegistryService`, the change feed
//! that fans revisions out to watchers, the REST admin API, worker status
//! reports and `mcp.d` / `policies.d` reconciliation, over a
//! [`quiver_store::Store`].

pub mod access;
pub mod approvals;
pub mod audit;
pub mod auth;
pub mod catalog;
pub mod encoded;
pub mod error;
pub mod explain;
pub mod feed;
pub mod grpc;
pub mod head;
pub mod oauth;
pub mod policies_dir;
pub mod preview;
pub mod rest;
mod server;
pub mod sessions;
pub mod signin;
pub mod state;
pub mod usage;
pub mod web;
pub mod workers;

pub use catalog::CatalogOptions;
pub use server::{
    ApprovalOptions, DEFAULT_GRPC_LISTEN, DEFAULT_HTTP_LISTEN, OAuthOptions, Registry,
    RegistryOptions, ServeError, http_router,
};
