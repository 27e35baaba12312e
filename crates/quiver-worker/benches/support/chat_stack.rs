//! The setup of the chat benchmarks: `servers` testkit MCP servers over
//! streamable HTTP with `tools` generated tools each (records with
//! `allowed_tools = ["generated_*"]`), the scripted upstream answering every
//! request at once with `answer` (bodies not kept, only their sizes), and
//! registry and worker over them, synced and warm. Included with
//! `#[path = "support/chat_stack.rs"] mod chat_stack;` (next to `stack`).

use std::collections::BTreeMap;

use quiver_model::{HttpConfig, McpServerSpec, Transport};
use quiver_testkit::mcp_server::{ExampleServer, HttpTestServer, spawn_streamable_http};
use quiver_testkit::upstream::{Reply, Script, ScriptedUpstream, UpstreamOptions};
use quiver_upstream::UpstreamOptions as WorkerUpstream;

use crate::stack::{BenchResult, Stack};

/// The MCP servers and the upstream, with registry and worker over them.
pub struct ChatStack {
    _servers: Vec<HttpTestServer>,
    /// The scripted OpenAI-compatible upstream.
    pub upstream: ScriptedUpstream,
    /// Registry and worker.
    pub stack: Stack,
}

impl ChatStack {
    /// Starts everything; returns once the worker is synced and warm.
    pub async fn start(servers: usize, tools: usize, answer: &'static str) -> BenchResult<Self> {
        let mut running = Vec::new();
        let mut specs = Vec::new();
        for i in 0..servers {
            let server =
                spawn_streamable_http(ExampleServer::example().with_generated_tools(tools)).await?;
            let mut spec = McpServerSpec::new(format!("bench-{i:02}"), Transport::StreamableHttp);
            spec.http = Some(HttpConfig {
                url: server.url().to_owned(),
                headers: BTreeMap::new(),
                auth_ref: None,
            });
            spec.allowed_tools = vec!["generated_*".into()];
            specs.push(spec);
            running.push(server);
        }
        let upstream = ScriptedUpstream::start_with(
            Script::respond(move |_, _| Reply::text(answer)),
            UpstreamOptions::new().with_record_bodies(false),
        )
        .await;
        let stack = Stack::start(
            specs,
            Some(WorkerUpstream::new(upstream.base_url().parse()?)),
        )
        .await?;
        Ok(ChatStack {
            _servers: running,
            upstream,
            stack,
        })
    }

    /// Stops worker, registry and upstream (the servers end when dropped).
    pub async fn stop(self) {
        self.stack.stop().await;
        self.upstream.shutdown().await;
    }
}
