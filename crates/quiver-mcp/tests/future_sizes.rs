//! The pool's futures hold no connect inline: opening a connection is a deep
//! future (transport, handshake, protocol eras), and with it inline every
//! call's future grew by its size, until a debug build's worker thread
//! overflowed its stack on gateway -> runner -> pool -> connect. The pool
//! boxes it where it opens a connection; these sizes show it did.

use std::sync::Arc;
use std::time::{Duration, Instant};

use quiver_mcp::connection::{ClientSide, ConnectSettings, Connection, StderrTail};
use quiver_mcp::launch::{Launch, StdioLaunch};
use quiver_mcp::server_log::ServerLog;
use quiver_mcp::{CallOptions, McpPool, PoolOptions};
use quiver_model::{McpServerSpec, StoredServer, Transport};

#[tokio::test]
async fn a_call_s_future_is_smaller_than_opening_a_connection() {
    let pool = McpPool::new(PoolOptions::default());
    let server = Arc::new(StoredServer::created(
        McpServerSpec::new("sizes", Transport::Stdio),
        1,
        "test",
    ));
    let launch = Launch::Stdio(StdioLaunch {
        command: "true".into(),
        args: Vec::new(),
        env: Default::default(),
        cwd: None,
    });
    let settings = ConnectSettings {
        initialize_timeout: Duration::from_secs(1),
        protocol: Default::default(),
        max_message_bytes: 1 << 20,
        http: reqwest::Client::new(),
        max_concurrent_requests: 1,
        egress: Default::default(),
        credentials: None,
        principal: None,
    };
    let (stderr, side) = (
        StderrTail::default(),
        ClientSide::standalone(ServerLog::new("sizes")),
    );
    // Futures do nothing until polled: none of these starts anything.
    let open = std::mem::size_of_val(&Connection::open(&launch, &settings, &stderr, &side, None));
    let call = std::mem::size_of_val(&pool.call_tool_with(
        &server,
        "echo",
        None,
        Instant::now(),
        CallOptions::default(),
    ));
    let info = std::mem::size_of_val(&pool.server_info(&server, None));
    eprintln!("future sizes: open {open} B, call_tool_with {call} B, server_info {info} B");
    assert!(
        call < open,
        "call_tool_with ({call} B) holds the connect ({open} B) inline"
    );
    assert!(
        info < open,
        "server_info ({info} B) holds the connect ({open} B) inline"
    );
    pool.shutdown().await;
}
