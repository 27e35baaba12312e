//! The test MCP server, under the path tests have always used: it lives in
//! `quiver-example-mcp` (the product's `quiver mcp-example` serves the same
//! server), whose stdio ([`quiver_example_mcp::server`]) and Streamable HTTP
//! ([`quiver_example_mcp::http`]) parts are re-exported here as one module.

pub use quiver_example_mcp::http::*;
pub use quiver_example_mcp::server::*;
