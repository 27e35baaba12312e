//! `quiver mcp-example`: the bundled example MCP server over stdio (echo,
//! add, counter, image, sleep), registered by `config/mcp.d/00-example.toml`
//! so `quiver dev` has a working server offline.

use quiver_example_mcp::server::{ExampleServer, serve_stdio};

/// Serves the example server on stdin/stdout until the client goes away.
pub async fn run() -> anyhow::Result<()> {
    serve_stdio(ExampleServer::example()).await?;
    Ok(())
}
