//! The worker's HTTP edge in process: the router built from real parts (an
//! in-process registry followed by a real sync service, a `ToolRunner` over a
//! real `McpPool` running the `quiver-testkit-mcp` binary over stdio; build
//! it first: `cargo build -p quiver-testkit`) and called with
//! `tower::ServiceExt::oneshot`, no listener. The tool API contract, and that
//! every refusal — the framework's too — is the JSON error object.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use quiver_mcp::{McpPool, PoolOptions};
use quiver_model::access::{ClaimRule, IdentityProviderRecord};
use quiver_model::approval::{ApprovalDecision, ApprovalState};
use quiver_model::policy::TaskPolicy;
use quiver_model::{ApprovalPolicy, McpServerSpec, Source, StdioConfig, Transport};
use quiver_store::{Store, UpsertRequest};
use quiver_sync::{SyncOptions, SyncService};
use quiver_testkit::mcp_server::testkit_mcp_bin;
use quiver_testkit::registry::{InProcessRegistry, WORKER_TOKEN};
use quiver_worker::audit::AuditOptions;
use quiver_worker::auth::{CallerToken, Callers, CallersConfig, Refusal, Via};
use quiver_worker::call::ToolRunner;
use quiver_worker::gateway::rebinding::RebindingGuard;
use quiver_worker::gateway::{Gateway, GatewayOptions};
use quiver_worker::http::{ApiState, MAX_REQUEST_BODY_BYTES, router};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

const TOKEN: &str = "caller-secret";
/// A caller whose task may only use server `other`.
const NARROW_TOKEN: &str = "narrow-secret";

/// A worker's router over a registry holding two stdio records of the same
/// server: `kit`, and `gated`, whose every call needs an approval.
struct Edge {
    router: Router,
    pool: McpPool,
    shutdown: CancellationToken,
    registry: InProcessRegistry,
}

impl Drop for Edge {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Edge {
    async fn start() -> Edge {
        Edge::start_with(Vec::new()).await
    }

    /// With callers from `identity_providers` too.
    async fn start_with(identity_providers: Vec<IdentityProviderRecord>) -> Edge {
        let registry = InProcessRegistry::sqlite(|_| {}).await;
        let mut spec = McpServerSpec::new("kit", Transport::Stdio);
        spec.stdio = Some(StdioConfig {
            command: testkit_mcp_bin().display().to_string(),
            ..Default::default()
        });
        spec.allowed_tools = vec!["*".into()];
        // The same server again, every call of it needing an approval.
        let mut gated = spec.clone();
        gated.server_id = "gated".into();
        gated.approval_policy = ApprovalPolicy::Always;
        for spec in [spec, gated] {
            registry
                .store
                .upsert(UpsertRequest {
                    spec,
                    expected_revision: None,
                    actor: "test".into(),
                    source: Source::Api,
                })
                .await
                .expect("record stored");
        }

        let shutdown = CancellationToken::new();
        let sync = SyncService::new(SyncOptions {
            registry_urls: vec![registry.grpc.clone()],
            token: Some(WORKER_TOKEN.into()),
            worker_id: "router-test".into(),
            ..Default::default()
        })
        .expect("sync options");
        let snapshot = sync.handle();
        let approvals = sync.approvals();
        tokio::spawn(sync.run(shutdown.clone()));
        tokio::time::timeout(Duration::from_secs(10), snapshot.wait_ready())
            .await
            .expect("first snapshot within 10 s");

        let callers = CallersConfig {
            callers: vec![
                CallerToken {
                    token: TOKEN.into(),
                    task: "default".into(),
                },
                CallerToken {
                    token: NARROW_TOKEN.into(),
                    task: "narrow".into(),
                },
            ],
            tasks: BTreeMap::from([(
                "narrow".to_owned(),
                TaskPolicy {
                    allowed_server_ids: Some(vec!["other".into()]),
                    ..Default::default()
                },
            )]),
            insecure_no_auth: false,
            identity_providers,
        };
        let callers = Callers::new(&callers, "127.0.0.1:0".parse().unwrap()).expect("callers");
        let pool = McpPool::new(PoolOptions::default());
        let runner = ToolRunner::new(
            pool.clone(),
            AuditOptions::default(),
            quiver_worker::DEFAULT_CATALOG_WAIT,
        )
        .with_approvals(approvals);
        let gateway = Gateway::new(
            runner.clone(),
            snapshot.clone(),
            GatewayOptions::default(),
            &shutdown,
        );
        let state = ApiState {
            snapshot,
            runner,
            callers: Arc::new(callers),
            upstream: None,
            gateway,
            rebinding: Arc::new(RebindingGuard::new(true, vec![], vec![])),
            metrics: None,
            tokens: None,
        };
        Edge {
            router: router(state),
            pool,
            shutdown,
            registry,
        }
    }

    /// Sends `request`; returns status, headers and the body as JSON (or as
    /// a JSON string when it is not JSON).
    async fn send(&self, request: Request<Body>) -> (StatusCode, axum::http::HeaderMap, Value) {
        let response = tokio::time::timeout(
            Duration::from_secs(20),
            self.router.clone().oneshot(request),
        )
        .await
        .expect("answer within 20 s")
        .expect("infallible");
        let (parts, body) = response.into_parts();
        let bytes = axum::body::to_bytes(body, 16 << 20).await.expect("body");
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (parts.status, parts.headers, body)
    }

    async fn call(&self, token: &str, body: Value) -> (StatusCode, Value) {
        let request = Request::post("/v1/mcp/tools/call")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let (status, _, body) = self.send(request).await;
        (status, body)
    }

    async fn get(
        &self,
        path: &str,
        authorization: Option<&str>,
    ) -> (StatusCode, axum::http::HeaderMap, Value) {
        let mut request = Request::get(path);
        if let Some(authorization) = authorization {
            request = request.header(header::AUTHORIZATION, authorization);
        }
        self.send(request.body(Body::empty()).unwrap()).await
    }
}

/// The JSON error object with `code`, a message and `retryable`.
#[track_caller]
fn assert_error(body: &Value, code: &str, retryable: bool) {
    let error = &body["error"];
    assert_eq!(error["code"], code, "{body}");
    assert_eq!(error["retryable"], retryable, "{body}");
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_api_contract() {
    let edge = Edge::start().await;

    // No token, a wrong token: 401 with the scheme to use.
    for authorization in [None, Some("Bearer wrong"), Some("Basic Y2FsbGVy")] {
        let (status, headers, body) = edge.get("/v1/mcp/tools", authorization).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{authorization:?}");
        assert_eq!(headers[header::WWW_AUTHENTICATE], "Bearer");
        assert_error(&body, "unauthenticated", false);
    }

    // `/v1/whoami` names the caller as it is known.
    let (status, _, body) = edge
        .get("/v1/whoami", Some(&format!("Bearer {NARROW_TOKEN}")))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["policy"], "narrow", "{body}");
    assert_eq!(body["via"], "static", "{body}");
    assert!(
        body["principal"].as_str().unwrap().starts_with("token:"),
        "{body}"
    );
    let (status, _, body) = edge.get("/v1/whoami", Some("Bearer wrong")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_error(&body, "unauthenticated", false);

    // The scheme is case-insensitive (RFC 9110 §11.1).
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let (status, _, body) = edge
            .get("/v1/mcp/tools", Some(&format!("{scheme} {TOKEN}")))
            .await;
        assert_eq!(status, StatusCode::OK, "{scheme}: {body}");
    }

    let (status, _, tools) = edge
        .get("/v1/mcp/tools", Some(&format!("Bearer {TOKEN}")))
        .await;
    assert_eq!(status, StatusCode::OK, "{tools}");
    let echo = tools
        .as_array()
        .expect("a list")
        .iter()
        .find(|tool| tool["tool_name"] == "echo" && tool["server_id"] == "kit")
        .unwrap_or_else(|| panic!("echo listed: {tools}"));
    assert_eq!(echo["input_schema"]["type"], "object");

    // By injected name and by `mcp.<server>.<tool>`.
    for name in [echo["name"].clone(), json!("mcp.kit.echo")] {
        let (status, body) = edge
            .call(TOKEN, json!({"name": name, "arguments": {"text": "hi"}}))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["content"][0]["text"], "hi", "{body}");
        assert_eq!(body["is_error"], false, "{body}");
    }

    // A server outside the caller's task, a tool no server has.
    let (status, body) = edge
        .call(
            NARROW_TOKEN,
            json!({"name": "mcp.kit.echo", "arguments": {"text": "hi"}}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_error(&body, "mcp_policy_denied", false);
    let (status, body) = edge
        .call(
            TOKEN,
            json!({"name": "mcp.kit.no_such_tool", "arguments": {}}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_error(&body, "mcp_policy_denied", false);

    // Arguments the schema refuses, arguments that are not an object.
    for arguments in [json!({"a": "one", "b": 2}), json!([1, 2])] {
        let (status, body) = edge
            .call(
                TOKEN,
                json!({"name": "mcp.kit.add", "arguments": arguments}),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_error(&body, "mcp_invalid_arguments", false);
    }

    // A body that is not a tool call.
    let (status, body) = edge.call(TOKEN, json!({"tool": "echo"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_error(&body, "invalid_request", false);

    edge.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framework_refusals_are_the_json_error_object() {
    let edge = Edge::start().await;
    let bearer = format!("Bearer {TOKEN}");

    // A body over the limit: 413, naming the limit.
    let oversized = vec![b' '; MAX_REQUEST_BODY_BYTES + 1];
    let request = Request::post("/v1/mcp/tools/call")
        .header(header::AUTHORIZATION, &bearer)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(oversized))
        .unwrap();
    let (status, headers, body) = edge.send(request).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(headers[header::CONTENT_TYPE], "application/json");
    assert_error(&body, "payload_too_large", false);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&MAX_REQUEST_BODY_BYTES.to_string()),
        "{body}"
    );

    // A repeated query parameter.
    let (status, headers, body) = edge
        .get(
            "/v1/mcp/tools?server_ids=kit&server_ids=other",
            Some(&bearer),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(headers[header::CONTENT_TYPE], "application/json");
    assert_error(&body, "invalid_request", false);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("server_ids"),
        "{body}"
    );

    // An unknown route, a known route with the wrong method.
    let (status, headers, body) = edge.get("/v1/mcp/nothing", Some(&bearer)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(headers[header::CONTENT_TYPE], "application/json");
    assert_error(&body, "not_found", false);
    let (status, headers, body) = edge.get("/v1/mcp/tools/call", Some(&bearer)).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{body}");
    assert_eq!(headers[header::CONTENT_TYPE], "application/json");
    assert_eq!(headers[header::ALLOW], "POST");
    assert_error(&body, "method_not_allowed", false);

    // Chat without an upstream.
    let request = Request::post("/v1/chat/completions")
        .header(header::AUTHORIZATION, &bearer)
        .body(Body::from(r#"{"messages": []}"#))
        .unwrap();
    let (status, headers, body) = edge.send(request).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(headers.contains_key("x-request-id"));
    assert_error(&body, "upstream_not_configured", false);
}

/// An OIDC issuer on 127.0.0.1 (the testkit's keys and minting, with an
/// OpenID discovery document naming its JWKS).
async fn oidc_issuer() -> Arc<quiver_testkit::oidc_issuer::OidcIssuer> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let issuer = Arc::new(quiver_testkit::oidc_issuer::OidcIssuer::new(&url));
    let discovery = {
        let issuer = issuer.clone();
        move || async move {
            let mut document = issuer.discovery_fields();
            document["issuer"] = json!(issuer.issuer());
            axum::Json(document)
        }
    };
    let app = issuer.router().route(
        "/.well-known/openid-configuration",
        axum::routing::get(discovery),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    issuer
}

fn mint(issuer: &quiver_testkit::oidc_issuer::OidcIssuer, claims: Value, ttl: i64) -> String {
    issuer
        .mint(quiver_testkit::oidc_issuer::MintRequest {
            claims: claims.as_object().unwrap().clone(),
            ttl_secs: Some(ttl),
            ..Default::default()
        })
        .unwrap()
}

/// Provider `corp` of `issuer`: `groups` containing `team-a` gets `task`.
fn corp(issuer: &str, task: &str) -> IdentityProviderRecord {
    IdentityProviderRecord {
        name: "corp".into(),
        issuer: issuer.into(),
        audiences: vec!["quiver".into()],
        rules: vec![ClaimRule {
            claim: "groups".into(),
            contains: Some("team-a".into()),
            policy: Some(task.into()),
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_callers_on_the_tool_api_and_the_gateway() {
    let issuer = oidc_issuer().await;
    let edge = Edge::start_with(vec![corp(issuer.issuer(), "default")]).await;
    let alice = mint(&issuer, json!({"sub": "alice", "groups": ["team-a"]}), 300);

    let (status, _, body) = edge
        .get("/v1/whoami", Some(&format!("Bearer {alice}")))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"principal": format!("oidc:{}#alice", issuer.issuer()), "policy": "default", "via": "oidc"})
    );
    let (status, body) = edge
        .call(
            &alice,
            json!({"name": "mcp.kit.echo", "arguments": {"text": "hi"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let initialize = |token: &str| {
        Request::post("/mcp")
            .header(header::HOST, "localhost")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream")
            .body(Body::from(
                json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "t", "version": "1"}}})
                .to_string(),
            ))
            .unwrap()
    };
    let (status, headers, body) = edge.send(initialize(&alice)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(headers.contains_key("mcp-session-id"), "{headers:?}");

    // Refused on the gateway: 401 with the MCP challenge, saying why.
    let expired = mint(&issuer, json!({"sub": "alice", "groups": ["team-a"]}), -600);
    let (status, headers, body) = edge.send(initialize(&expired)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_error(&body, "unauthenticated", false);
    assert_eq!(
        body["error"]["message"],
        "bearer token refused: token expired"
    );
    assert!(
        headers[header::WWW_AUTHENTICATE]
            .to_str()
            .unwrap()
            .starts_with("Bearer resource_metadata="),
        "{headers:?}"
    );
    // Verified, but no rule gives a task: 403, no challenge.
    let eve = mint(&issuer, json!({"sub": "eve", "groups": ["team-z"]}), 300);
    let (status, headers, body) = edge.send(initialize(&eve)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_error(&body, "identity_no_matching_rule", false);
    assert!(!headers.contains_key(header::WWW_AUTHENTICATE));
    let (status, _, body) = edge
        .get("/v1/mcp/tools", Some(&format!("Bearer {eve}")))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_error(&body, "identity_no_matching_rule", false);
}

#[tokio::test]
async fn callers_take_static_tokens_first_then_jwts() {
    let issuer = oidc_issuer().await;
    let config = CallersConfig {
        callers: vec![CallerToken {
            token: "static-token".into(),
            task: "default".into(),
        }],
        tasks: BTreeMap::from([(
            "team-a".to_owned(),
            TaskPolicy {
                allowed_server_ids: Some(vec!["x".into()]),
                ..Default::default()
            },
        )]),
        identity_providers: vec![corp(issuer.issuer(), "team-a")],
        ..Default::default()
    };
    let callers = Callers::new(&config, "127.0.0.1:0".parse().unwrap()).unwrap();
    let header = |token: &str| format!("Bearer {token}");
    let fixed = callers
        .identify(Some(&header("static-token")))
        .await
        .unwrap();
    assert_eq!(
        (fixed.via, fixed.task.name.as_str()),
        (Via::Static, "default")
    );
    assert!(fixed.id.principal().starts_with("token:"));

    let team_a = json!({"sub": "alice", "groups": ["team-a"]});
    let jwt = mint(&issuer, team_a.clone(), 300);
    let alice = callers.identify(Some(&header(&jwt))).await.unwrap();
    assert_eq!((alice.via, alice.task.name.as_str()), (Via::Oidc, "team-a"));
    assert_eq!(
        alice.id.principal(),
        format!("oidc:{}#alice", issuer.issuer())
    );
    // The same person with a fresh token is the same caller.
    let refreshed = callers
        .identify(Some(&header(&mint(&issuer, team_a, 600))))
        .await
        .unwrap();
    assert_eq!(refreshed.id, alice.id);
    assert_eq!(refreshed.id.tag(), alice.id.tag());

    let stranger = mint(&issuer, json!({"sub": "eve", "groups": []}), 300);
    let refusal = callers
        .identify(Some(&header(&stranger)))
        .await
        .unwrap_err();
    assert_eq!(
        refusal.code(),
        quiver_model::ErrorCode::IdentityNoMatchingRule
    );
    assert_eq!(
        quiver_worker::http::error::http_status(refusal.code()).as_u16(),
        403
    );
    assert!(
        refusal.message().contains("identity provider corp"),
        "{}",
        refusal.message()
    );

    let expired = mint(&issuer, json!({"sub": "alice", "groups": ["team-a"]}), -600);
    let refusal = callers.identify(Some(&header(&expired))).await.unwrap_err();
    assert_eq!(
        refusal,
        Refusal::Unauthenticated("bearer token refused: token expired".into())
    );
    assert!(!refusal.message().contains(&expired), "never the token");
    assert!(matches!(
        callers.identify(Some("Bearer not-a-jwt")).await,
        Err(Refusal::Unauthenticated(_))
    ));
}

/// A 2026-07-28 `tools/call` (no session) of `echo` at `/mcp/gated`, with
/// `extra` params merged in; the JSON-RPC message answered.
async fn gateway_call(edge: &Edge, capabilities: Value, extra: Value) -> Value {
    let mut params = json!({
        "name": "echo",
        "arguments": {"text": "approved call"},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": capabilities,
        },
    });
    for (key, value) in extra.as_object().expect("object") {
        if key == "_meta" {
            params["_meta"]
                .as_object_mut()
                .expect("meta")
                .extend(value.as_object().expect("meta object").clone());
        } else {
            params[key] = value.clone();
        }
    }
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params});
    let request = Request::post("/mcp/gated")
        .header(header::HOST, "localhost")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "echo")
        .body(Body::from(body.to_string()))
        .unwrap();
    let (status, _, answer) = edge.send(request).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    // One message, as JSON or as the first event of an SSE stream.
    let text = answer
        .as_str()
        .map(str::to_owned)
        .unwrap_or(answer.to_string());
    let message = text
        .lines()
        .find_map(|line| line.strip_prefix("data:"))
        .unwrap_or(&text)
        .trim()
        .to_owned();
    serde_json::from_str(&message).unwrap_or_else(|err| panic!("{text:?}: {err}"))
}

/// The approvals waiting for an approver.
async fn pending_approvals(edge: &Edge) -> Vec<String> {
    edge.registry
        .store
        .list_approvals(Some(ApprovalState::Pending), 100)
        .await
        .expect("approvals listed")
        .into_iter()
        .map(|approval| approval.approval_id)
        .collect()
}

async fn decide(edge: &Edge, id: &str, decision: ApprovalDecision) {
    edge.registry
        .store
        .decide_approval(id, decision, "approver", None)
        .await
        .expect("decided");
}

/// The §10 error code a tool error of the gateway carries.
fn tool_error_code(answer: &Value) -> &Value {
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    &answer["result"]["structuredContent"]["error"]["code"]
}

/// A gateway `tools/call` of a tool that needs an approval runs only after
/// an approver approved exactly that call, asked of a 2026-07-28 client by
/// `input_required` (docs/reference.md §13.7): one path with the tool
/// API's, in process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_calls_that_need_an_approval_run_only_once_approved() {
    let edge = Edge::start().await;
    let elicits = json!({"elicitation": {}});

    // Asked: an approval is requested, the round ends with its question.
    let asked = gateway_call(&edge, elicits.clone(), json!({})).await;
    let result = &asked["result"];
    assert_eq!(result["resultType"], "input_required", "{asked}");
    let question = &result["inputRequests"]["quiver-approval"];
    let pending = pending_approvals(&edge).await;
    assert_eq!(pending.len(), 1, "{pending:?}");
    let id = pending[0].clone();
    assert!(
        question["params"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&id)),
        "{asked}"
    );
    let state = result["requestState"]
        .as_str()
        .expect("requestState")
        .to_owned();
    let accept = json!({"quiver-approval": {"action": "accept"}});
    let retry = json!({"requestState": state, "inputResponses": accept});

    // Accepted before an approver decided: asked again, nothing ran.
    let again = gateway_call(&edge, elicits.clone(), retry.clone()).await;
    assert_eq!(again["result"]["resultType"], "input_required", "{again}");

    // Approved: the retry runs the call.
    decide(&edge, &id, ApprovalDecision::Approve).await;
    let done = gateway_call(&edge, elicits.clone(), retry.clone()).await;
    assert_eq!(done["result"]["resultType"], "complete", "{done}");
    assert_eq!(done["result"]["isError"], false, "{done}");
    assert_eq!(
        done["result"]["content"][0]["text"], "approved call",
        "{done}"
    );

    // The same state once more: the approval was used, the call does not run twice.
    let replayed = gateway_call(&edge, elicits.clone(), retry).await;
    assert_eq!(
        tool_error_code(&replayed),
        "mcp_approval_invalid",
        "{replayed}"
    );

    // The state is bound to the call: other arguments are refused (-32602).
    let other = gateway_call(
        &edge,
        elicits.clone(),
        json!({"requestState": state, "arguments": {"text": "another call"}}),
    )
    .await;
    assert_eq!(other["error"]["code"], -32602, "{other}");

    // A client that cannot be asked: refused, carrying the new approval's id.
    let refused = gateway_call(&edge, json!({}), json!({})).await;
    assert_eq!(
        tool_error_code(&refused),
        "mcp_approval_required",
        "{refused}"
    );
    let waiting = refused["result"]["structuredContent"]["error"]["approval_id"]
        .as_str()
        .expect("approval_id")
        .to_owned();
    assert!(pending_approvals(&edge).await.contains(&waiting));

    // Named in `_meta`: a denied approval refuses the call, an approved one runs it.
    decide(&edge, &waiting, ApprovalDecision::Deny).await;
    let named = |id: &str| json!({"_meta": {"quiver/approval_id": id}});
    let denied = gateway_call(&edge, json!({}), named(&waiting)).await;
    assert_eq!(tool_error_code(&denied), "mcp_approval_denied", "{denied}");
    let refused = gateway_call(&edge, json!({}), json!({})).await;
    let id = refused["result"]["structuredContent"]["error"]["approval_id"]
        .as_str()
        .expect("approval_id")
        .to_owned();
    decide(&edge, &id, ApprovalDecision::Approve).await;
    let ran = gateway_call(&edge, json!({}), named(&id)).await;
    assert_eq!(ran["result"]["isError"], false, "{ran}");
    assert_eq!(
        ran["result"]["content"][0]["text"], "approved call",
        "{ran}"
    );

    // A server that needs no approval runs at once, and the tool API's
    // refusal of the gated one names the approval it requested.
    let (status, body) = edge
        .call(
            TOKEN,
            json!({"name": "mcp.gated.echo", "arguments": {"text": "x"}}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "mcp_approval_required", "{body}");
    assert!(body["error"]["approval_id"].is_string(), "{body}");
}

/// A 2026-07-28 `tools/call` of `name` at `/mcp/kit` with `accept`; the
/// status, `Content-Type` and body.
async fn stateless_call(edge: &Edge, name: &str, accept: &str) -> (StatusCode, String, Value) {
    let body = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
        "name": name,
        "arguments": {"text": "lean"},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "router-test", "version": "1"},
        },
    }});
    let request = Request::post("/mcp/kit")
        .header(header::HOST, "localhost")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, accept)
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", name)
        .body(Body::from(body.to_string()))
        .unwrap();
    let (status, headers, answer) = edge.send(request).await;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (status, content_type, answer)
}

/// The lean edge (`http::mcp::plain`) answers a plain stateless call as
/// rmcp's service answers the same call sent the general way (a weighted
/// `Accept` is left to rmcp): the same status, media type and message, for
/// a result and for an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_stateless_calls_are_answered_as_rmcp_answers_them() {
    let edge = Edge::start().await;
    for name in ["echo", "no-such-tool"] {
        let plain = stateless_call(&edge, name, "application/json, text/event-stream").await;
        let general =
            stateless_call(&edge, name, "application/json;q=1.0, text/event-stream").await;
        assert_eq!(plain, general, "{name}");
        assert_eq!(plain.0, StatusCode::OK, "{name}: {plain:?}");
        assert!(plain.1.starts_with("application/json"), "{plain:?}");
    }
    let (_, _, echoed) = stateless_call(&edge, "echo", "application/json, text/event-stream").await;
    assert_eq!(echoed["result"]["content"][0]["text"], "lean", "{echoed}");
    assert_eq!(echoed["result"]["resultType"], "complete", "{echoed}");
    let (_, _, unknown) =
        stateless_call(&edge, "no-such-tool", "application/json, text/event-stream").await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
}
