//! `GatewayServer` in process: one session's server, served by rmcp over an
//! in-memory duplex pipe to an rmcp client, in front of a real `McpPool`
//! running the `quiver-testkit-mcp` binary over stdio (build it first:
//! `cargo build -p quiver-testkit`) and a snapshot followed from an
//! in-process registry by a real sync service. What the HTTP edge attaches
//! to every request (`GatewayRequest`: the caller, its task, the endpoint)
//! is attached here by the transport instead. `initialize`, `tools/list`
//! filtered by the caller's policy, `tools/call`, the `-32602` of a tool
//! the caller does not have, and the size of a call's future.

use std::sync::Arc;
use std::time::Duration;

use axum::http;
use quiver_mcp::{McpPool, PoolOptions};
use quiver_model::policy::TaskPolicy;
use quiver_sync::{SyncOptions, SyncService};
use quiver_testkit::mcp_server::testkit_mcp_bin;
use quiver_testkit::registry::{ADMIN_TOKEN, InProcessRegistry, WORKER_TOKEN};
use quiver_worker::DEFAULT_CATALOG_WAIT;
use quiver_worker::approval::ApprovalFlow;
use quiver_worker::audit::AuditOptions;
use quiver_worker::auth::{CallerId, Task};
use quiver_worker::call::{Call, CallContext, Lookup, ToolRunner};
use quiver_worker::gateway::peer::relay_channel;
use quiver_worker::gateway::request_meta::RequestMeta;
use quiver_worker::gateway::request_state::RequestStates;
use quiver_worker::gateway::scope::Scope;
use quiver_worker::gateway::server::{GatewayRequest, GatewayServer, Invocation, Shared};
use rmcp::model::{CallToolRequestParams, ErrorCode, RequestId};
use rmcp::service::{
    ClientInitializeError, RoleServer, RunningService, RxJsonRpcMessage, TxJsonRpcMessage,
};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::{RoleClient, ServiceError, ServiceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// How long a test waits for any one answer.
const BOUND: Duration = Duration::from_secs(20);

/// The gateway's shared state over a registry holding the test server as
/// `kit` and again as `other`.
struct Gateway {
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    _registry: InProcessRegistry,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Gateway {
    async fn start() -> Gateway {
        let registry = InProcessRegistry::sqlite(|_| {}).await;
        // Through the admin API, as an operator adds records.
        for server_id in ["kit", "other"] {
            let response = reqwest::Client::new()
                .post(format!("{}/admin/api/mcp/servers", registry.http))
                .bearer_auth(ADMIN_TOKEN)
                .json(&json!({
                    "server_id": server_id,
                    "transport": "stdio",
                    "stdio": {"command": testkit_mcp_bin()},
                    "allowed_tools": ["*"],
                }))
                .send()
                .await
                .expect("POST record");
            assert!(response.status().is_success(), "{response:?}");
        }
        let shutdown = CancellationToken::new();
        let sync = SyncService::new(SyncOptions {
            registry_urls: vec![registry.grpc.clone()],
            token: Some(WORKER_TOKEN.into()),
            worker_id: "gateway-server-test".into(),
            ..Default::default()
        })
        .expect("sync options");
        let snapshot = sync.handle();
        tokio::spawn(sync.run(shutdown.clone()));
        tokio::time::timeout(BOUND, snapshot.wait_ready())
            .await
            .expect("first snapshot");
        let runner = ToolRunner::new(
            McpPool::new(PoolOptions::default()),
            AuditOptions::default(),
            DEFAULT_CATALOG_WAIT,
        );
        let shared = Arc::new(Shared {
            runner,
            snapshot,
            sessions: Arc::default(),
            states: RequestStates::random(),
        });
        Gateway {
            shared,
            shutdown,
            _registry: registry,
        }
    }

    /// A client session with a new `GatewayServer` at `scope`, for a caller
    /// under `policy`, initialized.
    async fn session(&self, scope: Scope, policy: TaskPolicy) -> RunningService<RoleClient, ()> {
        self.open(scope, policy).await.expect("initialized")
    }

    /// Opens a session like [`Gateway::session`]: the server's answer to
    /// `initialize`.
    async fn open(
        &self,
        scope: Scope,
        policy: TaskPolicy,
    ) -> Result<RunningService<RoleClient, ()>, ClientInitializeError> {
        let (client_end, server_end) = tokio::io::duplex(1 << 20);
        let (read, write) = tokio::io::split(server_end);
        let transport = AsEdge {
            inner: AsyncRwTransport::new_server(read, write),
            request: GatewayRequest {
                task: task(policy),
                caller: CallerId::of_principal("key:alice".into()),
                scope,
                request_id: "gateway-server-test".into(),
                session: None,
            },
        };
        let server = GatewayServer::new(self.shared.clone());
        tokio::spawn(async move {
            // An initialize the server refuses ends the session; the client
            // sees the refusal.
            if let Ok(running) = server.serve(transport).await {
                let _ = running.waiting().await;
            }
        });
        tokio::time::timeout(BOUND, ().serve(client_end))
            .await
            .expect("initialize answered in time")
    }
}

/// The caller's task under `policy`.
fn task(policy: TaskPolicy) -> Task {
    Task {
        name: "default".into(),
        policy: Arc::new(policy.compile().expect("a valid policy")),
    }
}

/// The server end of the pipe, attaching `request` to every request as the
/// HTTP edge does (in the request's `http::request::Parts`).
struct AsEdge<T> {
    inner: T,
    request: GatewayRequest,
}

impl<T: Transport<RoleServer>> Transport<RoleServer> for AsEdge<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        let mut message = self.inner.receive().await?;
        if let rmcp::model::JsonRpcMessage::Request(request) = &mut message {
            let (mut parts, ()) = http::Request::new(()).into_parts();
            parts.extensions.insert(self.request.clone());
            rmcp::model::GetExtensions::extensions_mut(&mut request.request).insert(parts);
        }
        Some(message)
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// `tools/call` of `name` with `arguments`.
async fn call(
    session: &RunningService<RoleClient, ()>,
    name: &str,
    arguments: serde_json::Value,
) -> Result<rmcp::model::CallToolResult, ServiceError> {
    let mut params = CallToolRequestParams::new(name.to_owned());
    params.arguments = arguments.as_object().cloned();
    tokio::time::timeout(BOUND, session.call_tool(params))
        .await
        .unwrap_or_else(|_| panic!("{name} answered in time"))
}

/// The text of a result's first item.
fn text(result: &rmcp::model::CallToolResult) -> &str {
    result
        .content
        .first()
        .and_then(|item| item.as_text())
        .map(|text| text.text.as_str())
        .unwrap_or_else(|| panic!("not text: {result:?}"))
}

/// The name the session's server introduced itself by.
fn server_name(session: &RunningService<RoleClient, ()>) -> String {
    let info = session.peer_info().expect("initialized");
    assert!(info.capabilities.tools.is_some(), "{info:?}");
    info.server_info
        .as_ref()
        .map(|implementation| implementation.name.clone())
        .unwrap_or_default()
}

/// A call refused with `-32602` naming the tool.
#[track_caller]
fn assert_unknown(result: Result<rmcp::model::CallToolResult, ServiceError>, name: &str) {
    match result {
        Err(ServiceError::McpError(error)) => {
            assert_eq!(error.code, ErrorCode::INVALID_PARAMS, "{error:?}");
            assert!(error.message.contains(name), "{error:?}");
        }
        other => panic!("{name} was not refused as unknown: {other:?}"),
    }
}

/// The sorted names of `tools/list`.
async fn tool_names(session: &RunningService<RoleClient, ()>) -> Vec<String> {
    let tools = tokio::time::timeout(BOUND, session.list_all_tools())
        .await
        .expect("listed in time")
        .expect("listed");
    let mut names: Vec<String> = tools.iter().map(|tool| tool.name.to_string()).collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalog_endpoint_serves_the_callers_tools_under_injected_names() {
    let gateway = Gateway::start().await;
    let policy = TaskPolicy {
        allowed_server_ids: Some(vec!["kit".into()]),
        tool_denylist: vec!["kit.fail".into(), "kit.crash".into()],
        ..Default::default()
    };
    let session = gateway.session(Scope::catalog(None), policy).await;
    assert_eq!(server_name(&session), "quiver-gateway");

    // Only `kit`'s tools, without the denied ones, under injected names.
    let catalog = gateway
        .shared
        .runner
        .catalog(
            &gateway.shared.snapshot.current(),
            &task(TaskPolicy::default()),
            None,
            None,
            None,
        )
        .await;
    let injected = |server_id: &str, tool: &str| {
        catalog
            .tools()
            .find(|t| t.server_id() == server_id && t.tool_name() == tool)
            .unwrap_or_else(|| panic!("{server_id}.{tool} exists"))
            .injected_name
            .clone()
    };
    let names = tool_names(&session).await;
    assert!(names.contains(&injected("kit", "echo")), "{names:?}");
    for (server_id, tool) in [("kit", "fail"), ("kit", "crash"), ("other", "echo")] {
        assert!(
            !names.contains(&injected(server_id, tool)),
            "{server_id}.{tool} listed: {names:?}"
        );
    }

    let echoed = call(&session, &injected("kit", "echo"), json!({"text": "hi"}))
        .await
        .expect("echo");
    assert_eq!(text(&echoed), "hi");
    assert_ne!(echoed.is_error, Some(true));

    // Names the caller does not have: own names, denied tools, other
    // servers' tools, and names of nothing.
    let denied = injected("kit", "fail");
    let elsewhere = injected("other", "echo");
    for name in ["echo", denied.as_str(), elsewhere.as_str(), "mcp.kit.nope"] {
        assert_unknown(call(&session, name, json!({"text": "x"})).await, name);
    }
    // The session still serves after the refusals.
    assert_eq!(
        text(
            &call(&session, "mcp.kit.echo", json!({"text": "again"}))
                .await
                .expect("echo again")
        ),
        "again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_endpoint_is_the_server_under_its_own_names() {
    let gateway = Gateway::start().await;
    let policy = TaskPolicy {
        tool_denylist: vec!["kit.fail".into()],
        ..Default::default()
    };
    let session = gateway.session(Scope::Server("kit".into()), policy).await;
    // The server as it introduced itself to the worker.
    let name = server_name(&session);
    assert!(!name.is_empty() && name != "quiver-gateway", "{name}");
    let names = tool_names(&session).await;
    assert!(names.contains(&"echo".to_owned()), "{names:?}");
    assert!(!names.contains(&"fail".to_owned()), "{names:?}");
    assert!(
        names.iter().all(|name| !name.starts_with("mcp")),
        "{names:?}"
    );

    let echoed = call(&session, "echo", json!({"text": "hi"}))
        .await
        .expect("echo");
    assert_eq!(text(&echoed), "hi");
    for name in ["fail", "mcp.kit.echo", "nope"] {
        assert_unknown(call(&session, name, json!({"text": "x"})).await, name);
    }

    // A server the caller may not use is no endpoint for it: the session
    // does not start.
    let narrow = TaskPolicy {
        allowed_server_ids: Some(vec!["other".into()]),
        ..Default::default()
    };
    let Err(error) = gateway.open(Scope::Server("kit".into()), narrow).await else {
        panic!("a session started on a server the caller may not use");
    };
    assert!(
        error.to_string().contains("not a server available"),
        "{error}"
    );
}

/// A gateway `tools/call` holds the runner's call once and little of its
/// own: its future is what every call allocates (the lean edge boxes it),
/// and storing the runner's future again at each level that took it by
/// value (and the cold paths of consent and approvals inline) once made it
/// seven times the runner's (BENCHMARKS.md, "The size of a gateway call's
/// future"). The runner boxes the call on the wire, so its own future is
/// small; the gateway's state beside it is ~2.4 KB in the debug build, and
/// the runner's future held a second time would pass the bound.
#[tokio::test]
async fn a_gateway_call_s_future_holds_the_runner_s_call_once() {
    const GATEWAY_OWN_STATE: usize = 3 * 1024;
    let gateway = Gateway::start().await;
    let task = task(TaskPolicy::default());
    let request = GatewayRequest {
        task: task.clone(),
        caller: CallerId::of_principal("key:alice".into()),
        scope: Scope::Server("kit".into()),
        request_id: "gateway-server-test".into(),
        session: None,
    };
    let (relay, _relayed) = relay_channel();
    let invocation = Invocation::plain(RequestId::Number(1), RequestMeta::default(), &relay);
    let server = GatewayServer::new(gateway.shared.clone());
    let snapshot = gateway.shared.snapshot.current();
    let context = CallContext::new("size".into(), request.caller.clone(), &task, None);
    // Futures do nothing until polled: neither call starts.
    let gateway_call = std::mem::size_of_val(&server.call(
        &request,
        CallToolRequestParams::new("echo"),
        &invocation,
    ));
    let runner_call = std::mem::size_of_val(&gateway.shared.runner.call(
        &task,
        &context,
        Call {
            name: "echo",
            arguments: None,
            lookup: Lookup::OwnName {
                snapshot: &snapshot,
                server_id: "kit",
            },
            approval: ApprovalFlow::Refuse,
        },
    ));
    eprintln!("future sizes: gateway call {gateway_call} B, runner call {runner_call} B");
    assert!(
        gateway_call < runner_call + GATEWAY_OWN_STATE,
        "the gateway's call ({gateway_call} B) holds more than the runner's ({runner_call} B) and {GATEWAY_OWN_STATE} B of its own"
    );
}
