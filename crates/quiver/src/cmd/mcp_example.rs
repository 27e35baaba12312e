//! `quiver mcp-example`: the bundled example MCP server over stdio (echo,
//! add, counter, image, sleep), registered by `config/mcp.d/00-example.toml`
//! so `quiver dev` has a working server offline.

/// Serves the example server on stdin/stdout until the client goes away.
pub async fn run() -> anyhow::Result<()> {
    quiver_testkit::mcp_server::serve_stdio(quiver_testkit::mcp_server::TestServer::example())
        .await?;
    Ok(())
}
