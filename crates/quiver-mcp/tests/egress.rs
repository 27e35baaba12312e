//! The pool under an egress allowlist, against the test MCP server over
//! streamable HTTP: refused hosts fail before connecting with
//! `mcp_policy_denied` (also while the entry backs off), hosts allowed
//! through a CIDR are resolved, checked and reached on the checked
//! addresses.

use std::sync::Arc;
use std::time::Duration;

use quiver_mcp::egress::EgressPolicy;
use quiver_mcp::{HealthState, McpPool, PoolOptions};
use quiver_model::{HttpConfig, McpServerSpec, StoredServer, Transport};
use quiver_testkit::mcp_server::{ExampleServer, spawn_streamable_http};

fn server(id: &str, url: &str) -> Arc<StoredServer> {
    let mut spec = McpServerSpec::new(id, Transport::StreamableHttp);
    spec.http = Some(HttpConfig {
        url: url.to_owned(),
        headers: Default::default(),
        auth_ref: None,
    });
    spec.allowed_tools = vec!["*".into()];
    Arc::new(StoredServer::created(spec, 1, "test"))
}

fn pool(hosts: &[&str], cidrs: &[&str]) -> McpPool {
    McpPool::new(PoolOptions {
        egress: EgressPolicy::new(hosts, cidrs).unwrap(),
        initialize_timeout: Duration::from_secs(5),
        ..PoolOptions::default()
    })
}

#[tokio::test]
async fn a_resolved_host_outside_the_cidrs_is_refused_every_time() {
    let http = spawn_streamable_http(ExampleServer::full()).await.unwrap();
    let url = http.url().replace("127.0.0.1", "localhost");
    let pool = pool(&[], &["10.0.0.0/8"]);
    let record = server("outside", &url);
    for attempt in 0..2 {
        let err = pool.list_tools(&record).await.unwrap_err();
        assert_eq!(
            err.code(),
            quiver_model::ErrorCode::McpPolicyDenied,
            "attempt {attempt}: {err}"
        );
        assert!(err.to_string().contains("\"localhost\""), "{err}");
        let err = pool.call_tool(&record, "echo", None).await.unwrap_err();
        assert_eq!(
            err.code(),
            quiver_model::ErrorCode::McpPolicyDenied,
            "attempt {attempt}: {err}"
        );
    }
    let health = pool.health();
    assert_eq!(health[0].state, HealthState::Down);
    assert!(
        health[0]
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("egress")),
        "{health:?}"
    );
    pool.shutdown().await;
}

#[tokio::test]
async fn hosts_allowed_by_name_or_cidr_connect_and_literals_outside_are_refused_up_front() {
    let http = spawn_streamable_http(ExampleServer::full()).await.unwrap();
    let by_name = http.url().replace("127.0.0.1", "localhost");
    let pool = pool(&[], &["127.0.0.0/8", "::1/128"]);
    let tools = pool.list_tools(&server("pinned", &by_name)).await.unwrap();
    assert!(tools.iter().any(|tool| tool.name == "echo"));

    let named = self::pool(&["LOCALHOST"], &[]);
    named.list_tools(&server("named", &by_name)).await.unwrap();
    let literal = server("literal", http.url());
    let err = named.list_tools(&literal).await.unwrap_err();
    assert_eq!(err.code(), quiver_model::ErrorCode::McpPolicyDenied);
    assert!(!err.retryable());
    // Refused when the entry is built: down before any connect.
    assert!(
        named
            .health()
            .iter()
            .any(|h| h.server_id == "literal" && h.state == HealthState::Down)
    );
    pool.shutdown().await;
    named.shutdown().await;
}
