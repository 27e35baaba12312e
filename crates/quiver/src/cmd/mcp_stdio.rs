//! `quiver mcp-stdio --worker URL [--server ID]`: an MCP stdio server that
//! relays to a worker's MCP endpoint, for clients that can only launch
//! stdio servers.
//!
//! Messages are relayed as they are, in both directions, between rmcp's
//! stdio transport and its streamable HTTP client transport (which holds the
//! HTTP session: the `Mcp-Session-Id` header, the GET stream for what the
//! worker sends unasked). Nothing is interpreted, so whatever the worker's
//! endpoint serves (tools, resources, prompts, notifications, cancellation,
//! server requests) reaches the client unchanged.

use anyhow::Context;
use clap::Args;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, Transport};
use rmcp::{RoleClient, RoleServer};

/// Flags of `quiver mcp-stdio`.
#[derive(Args, Debug)]
pub struct McpStdioArgs {
    /// The worker's base URL (e.g. http://127.0.0.1:8090).
    #[arg(long, env = "QUIVER_WORKER_URL")]
    pub worker: String,
    /// Relay `/mcp/<ID>` (one server as itself) instead of `/mcp` (the
    /// caller's whole catalog).
    #[arg(long)]
    pub server: Option<String>,
    /// Caller token for the worker (prefer QUIVER_TOKEN: flags are visible
    /// in `ps`).
    #[arg(long, env = "QUIVER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// The endpoint URL the flags name.
fn endpoint(args: &McpStdioArgs) -> anyhow::Result<String> {
    let mut url = url::Url::parse(&args.worker)
        .with_context(|| format!("--worker {:?} is not a URL", args.worker))?;
    {
        let mut path = url
            .path_segments_mut()
            .map_err(|()| anyhow::anyhow!("--worker {:?} cannot be a base URL", args.worker))?;
        path.pop_if_empty().push("mcp");
        if let Some(server) = &args.server {
            path.push(server);
        }
    }
    Ok(url.into())
}

/// Relays stdin/stdout to the worker until either side closes.
pub async fn run(args: McpStdioArgs) -> anyhow::Result<()> {
    let url = endpoint(&args)?;
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.clone());
    if let Some(token) = &args.token {
        config = config.auth_header(token.clone());
    }
    let http = quiver_mcp::egress::http_client_builder()
        .build()
        .context("building the HTTP client")?;
    let mut worker = StreamableHttpClientTransport::with_client(http, config);
    let mut client = rmcp::transport::async_rw::AsyncRwTransport::<RoleServer, _, _>::new_server(
        tokio::io::stdin(),
        tokio::io::stdout(),
    );
    loop {
        tokio::select! {
            from_client = client.receive() => {
                let Some(message) = from_client else { break };
                Transport::<RoleClient>::send(&mut worker, message)
                    .await
                    .with_context(|| format!("sending to {url}"))?;
            }
            from_worker = Transport::<RoleClient>::receive(&mut worker) => {
                let Some(message) = from_worker else {
                    anyhow::bail!("{url} closed the session");
                };
                client.send(message).await.context("writing to stdout")?;
            }
        }
    }
    let _ = Transport::<RoleClient>::close(&mut worker).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_is_the_workers_mcp_path() {
        let args = |worker: &str, server: Option<&str>| McpStdioArgs {
            worker: worker.into(),
            server: server.map(Into::into),
            token: None,
        };
        assert_eq!(
            endpoint(&args("http://127.0.0.1:8090", None)).unwrap(),
            "http://127.0.0.1:8090/mcp"
        );
        assert_eq!(
            endpoint(&args("http://w:1/base/", Some("every thing"))).unwrap(),
            "http://w:1/base/mcp/every%20thing"
        );
        assert!(endpoint(&args("not a url", None)).is_err());
    }
}
