//! The example MCP server: a real MCP server on the official `rmcp` SDK with
//! a small set of tools (`echo`, `add`, `counter`, `image`, `sleep`), served
//! by `quiver mcp-example` over stdio so `quiver dev` works offline, and the
//! same server with its fault-injection tools for tests ([`server::Profile`]).
//!
//! The product binary needs only [`server`] (stdio). The HTTP transports
//! the tests serve it over, Streamable HTTP ([`http`]) and the legacy
//! HTTP+SSE transport ([`legacy_sse`]), are behind the `http` feature, which
//! only the test support (`quiver-testkit`) turns on.

#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "http")]
pub mod legacy_sse;
pub mod server;
