//! Test support shared by Quiver's crates and end-to-end tests. Everything
//! here talks to real components: a real PostgreSQL server, real processes.

pub mod bench;
pub mod bench_servers;
#[cfg(feature = "proptest")]
pub mod fuzz;
pub use quiver_example_mcp::legacy_sse;
pub mod mcp_server;
pub mod oauth_server;
pub mod oidc_issuer;
pub mod postgres;
#[cfg(feature = "registry")]
pub mod registry;
mod scenario_inputs;
pub mod scenario_server;
pub mod upstream;
