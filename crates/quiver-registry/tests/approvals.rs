//! Approvals through the registry's real listeners (docs/reference.md
//! §13.7): workers request and use them over gRPC, approvers decide over
//! REST. Two gRPC clients stand for two workers sharing one registry.

mod common;

use std::time::Duration;

use common::{ADMIN, TestRegistry, WORKER, rest, sqlite_registry};
use quiver_model::approval::canonical_arguments_hash;
use quiver_proto::credentials::{ApprovalClient, Credentials};
use quiver_proto::v1 as pb;
use quiver_registry::ApprovalOptions;
use reqwest::Method;
use serde_json::{Value, json};
use tonic::transport::Channel;

const APPROVER: &str = "approver-secret";

fn with_approvals(ttl: Duration) -> impl FnOnce(&mut quiver_registry::RegistryOptions) {
    move |options| {
        options.approvals = ApprovalOptions {
            approver_token: Some(APPROVER.into()),
            ttl,
            ..Default::default()
        };
    }
}

async fn registry(ttl: Duration) -> TestRegistry {
    sqlite_registry(with_approvals(ttl)).await
}

async fn worker(registry: &TestRegistry, name: &str) -> ApprovalClient {
    let channel = Channel::from_shared(registry.grpc.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    Credentials::new(Some(WORKER), Some(name))
        .unwrap()
        .approval_client(channel)
}

fn arguments() -> Value {
    json!({"path": "/srv/data", "api_key": "sk-live", "options": {"force": true}})
}

fn request(arguments: &Value) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        task: "task-7".into(),
        server_id: "files".into(),
        tool: "files__delete".into(),
        arguments_json: arguments.to_string(),
        arguments_hash: canonical_arguments_hash(arguments),
        record_revision: 4,
        requested_by: CALLER_A.into(),
        worker_id: String::new(),
    }
}

/// Principals of two callers, as workers send them (`CallerId::principal`).
const CALLER_A: &str = "token:00000000000000aa";
const CALLER_B: &str = "token:00000000000000bb";

fn use_of(approval_id: &str, arguments: &Value) -> pb::UseApprovalRequest {
    let request = request(arguments);
    pb::UseApprovalRequest {
        approval_id: approval_id.into(),
        task: request.task,
        server_id: request.server_id,
        tool: request.tool,
        arguments_hash: request.arguments_hash,
        record_revision: request.record_revision,
        used_by: CALLER_A.into(),
        worker_id: String::new(),
    }
}

async fn requested(client: &mut ApprovalClient) -> String {
    requested_with(client, &arguments()).await
}

async fn requested_with(client: &mut ApprovalClient, arguments: &Value) -> String {
    let approval = client
        .request_approval(request(arguments))
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    assert_eq!(approval.state, i32::from(pb::ApprovalState::Pending));
    assert_eq!(approval.requested_by, CALLER_A);
    approval.approval_id
}

async fn decide(registry: &TestRegistry, token: &str, id: &str, decision: &str) -> (u16, Value) {
    rest(
        registry,
        Method::POST,
        &format!("/admin/api/approvals/{id}"),
        Some(token),
        Some(&json!({"decision": decision, "note": "checked"}).to_string()),
    )
    .await
}

fn outcome(response: &pb::UseApprovalResponse) -> pb::UseApprovalOutcome {
    pb::UseApprovalOutcome::try_from(response.outcome).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn request_on_a_approve_over_rest_run_on_b_exactly_once() {
    two_workers_one_registry(registry(Duration::from_secs(900)).await).await;
}

/// The same on PostgreSQL, where the two uses race on real concurrent
/// connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn request_on_a_approve_over_rest_run_on_b_exactly_once_postgres() {
    two_workers_one_registry(
        TestRegistry::postgres(with_approvals(Duration::from_secs(900))).await,
    )
    .await;
}

async fn two_workers_one_registry(registry: TestRegistry) {
    let mut a = worker(&registry, "worker-a").await;
    let mut b = worker(&registry, "worker-b").await;
    let id = requested(&mut a).await;

    // Listed pending, arguments masked where keys look secret.
    let (status, list) = rest(
        &registry,
        Method::GET,
        "/admin/api/approvals?state=pending",
        Some(APPROVER),
        None,
    )
    .await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["approvals"][0]["approval_id"], id.as_str());
    assert_eq!(list["approvals"][0]["arguments"]["api_key"], "********");
    assert_eq!(list["approvals"][0]["arguments"]["path"], "/srv/data");

    // Not usable before the decision; the worker token cannot decide.
    let early = b
        .use_approval(use_of(&id, &arguments()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(outcome(&early), pb::UseApprovalOutcome::Pending);
    let (status, body) = decide(&registry, WORKER, &id, "approve").await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "permission_denied");
    // The approver token reaches nothing else.
    let (status, _) = rest(
        &registry,
        Method::GET,
        "/admin/api/mcp/servers",
        Some(APPROVER),
        None,
    )
    .await;
    assert_eq!(status, 403);

    let (status, approved) = decide(&registry, APPROVER, &id, "approve").await;
    assert_eq!(status, 200, "{approved}");
    assert_eq!(approved["state"], "approved");
    assert_eq!(approved["decided_by"], "approver");
    assert_eq!(approved["note"], "checked");
    let (status, again) = decide(&registry, ADMIN, &id, "deny").await;
    assert_eq!(status, 409, "{again}");
    assert_eq!(again["error"]["code"], "approval_not_pending");

    // Other arguments, another tool, another task: refused, still usable.
    let other_args = json!({"path": "/"});
    let refused = b
        .use_approval(use_of(&id, &other_args))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(outcome(&refused), pb::UseApprovalOutcome::Mismatch);
    assert_eq!(refused.mismatch_field, "arguments_hash");
    for (field, change) in [
        (
            "tool",
            Box::new(|r: &mut pb::UseApprovalRequest| r.tool = "files__read".into())
                as Box<dyn Fn(&mut pb::UseApprovalRequest)>,
        ),
        (
            "task",
            Box::new(|r: &mut pb::UseApprovalRequest| r.task = "task-8".into()),
        ),
        (
            "record_revision",
            Box::new(|r: &mut pb::UseApprovalRequest| r.record_revision = 5),
        ),
    ] {
        let mut call = use_of(&id, &arguments());
        change(&mut call);
        let refused = b.use_approval(call).await.unwrap().into_inner();
        assert_eq!(outcome(&refused), pb::UseApprovalOutcome::Mismatch);
        assert_eq!(refused.mismatch_field, field);
    }

    // Worker B runs it, twice concurrently with A: exactly one use.
    let (first, second) = tokio::join!(
        b.use_approval(use_of(&id, &arguments())),
        a.use_approval(use_of(&id, &arguments()))
    );
    let outcomes = [
        outcome(&first.unwrap().into_inner()),
        outcome(&second.unwrap().into_inner()),
    ];
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| **o == pb::UseApprovalOutcome::Used)
            .count(),
        1,
        "{outcomes:?}"
    );
    assert!(outcomes.contains(&pb::UseApprovalOutcome::AlreadyUsed));
    // Replay refused.
    let replay = b
        .use_approval(use_of(&id, &arguments()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(outcome(&replay), pb::UseApprovalOutcome::AlreadyUsed);
    let shown = a
        .get_approval(pb::GetApprovalRequest {
            approval_id: id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    assert_eq!(shown.state, i32::from(pb::ApprovalState::Used));
    let (_, used) = rest(
        &registry,
        Method::GET,
        "/admin/api/approvals?state=used",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(used["approvals"][0]["approval_id"], id.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denial_expiry_and_bad_requests_are_refused() {
    let registry = registry(Duration::from_millis(1500)).await;
    let mut a = worker(&registry, "worker-a").await;

    let denied = requested(&mut a).await;
    let (status, body) = decide(&registry, ADMIN, &denied, "deny").await;
    assert_eq!((status, body["state"].as_str()), (200, Some("denied")));
    let refused = a
        .use_approval(use_of(&denied, &arguments()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(outcome(&refused), pb::UseApprovalOutcome::Denied);

    let approved = requested(&mut a).await;
    let pending = requested_with(&mut a, &json!({"path": "/srv/other"})).await;
    assert_eq!(decide(&registry, ADMIN, &approved, "approve").await.0, 200);
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let expired = a
        .use_approval(use_of(&approved, &arguments()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(outcome(&expired), pb::UseApprovalOutcome::Expired);
    let (status, body) = decide(&registry, ADMIN, &pending, "approve").await;
    assert_eq!(status, 409, "{body}");
    let (_, list) = rest(
        &registry,
        Method::GET,
        "/admin/api/approvals?state=expired",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(list["approvals"].as_array().unwrap().len(), 2, "{list}");

    // Unknown ids, a hash that is not the arguments', the approver on gRPC.
    let missing = a
        .use_approval(use_of("apr_missing", &arguments()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(outcome(&missing), pb::UseApprovalOutcome::NotFound);
    assert_eq!(
        decide(&registry, ADMIN, "apr_missing", "approve").await.0,
        404
    );
    let mut forged = request(&arguments());
    forged.arguments_hash = canonical_arguments_hash(&json!({}));
    let err = a.request_approval(forged).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("arguments_hash"),
        "{}",
        err.message()
    );
    let channel = Channel::from_shared(registry.grpc.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut approver = Credentials::new(Some(APPROVER), None)
        .unwrap()
        .approval_client(channel);
    let err = approver
        .request_approval(request(&arguments()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    let (status, body) = rest(
        &registry,
        Method::GET,
        "/admin/api/approvals?state=nope",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (400, Some("state"))
    );
    let (status, _) = decide(&registry, ADMIN, &pending, "maybe").await;
    assert_eq!(status, 400);
    // The worker token may not read approvals over REST either.
    let (status, _) = rest(
        &registry,
        Method::GET,
        "/admin/api/approvals",
        Some(WORKER),
        None,
    )
    .await;
    assert_eq!(status, 403);
}

fn with_limits(
    ttl: Duration,
    max_pending: u32,
    retention: Duration,
) -> impl FnOnce(&mut quiver_registry::RegistryOptions) {
    move |options| {
        options.approvals = ApprovalOptions {
            approver_token: Some(APPROVER.into()),
            ttl,
            max_pending_per_caller: max_pending,
            retention,
        };
    }
}

async fn request_as(
    client: &mut ApprovalClient,
    caller: &str,
    arguments: &Value,
) -> Result<pb::Approval, tonic::Status> {
    let mut request = request(arguments);
    request.requested_by = caller.into();
    request.worker_id = "worker-a".into();
    Ok(client
        .request_approval(request)
        .await?
        .into_inner()
        .approval
        .unwrap())
}

/// Issue #21 item 3: one caller's pending approvals are capped (the cap
/// named in the refusal), other callers unaffected; identical pending
/// requests of one caller get one id, racing ones included.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pending_approvals_are_capped_per_caller_and_identical_requests_merge() {
    capped_and_merged(
        sqlite_registry(with_limits(
            Duration::from_secs(900),
            3,
            Duration::from_secs(3600),
        ))
        .await,
    )
    .await;
}

/// The same on PostgreSQL, where the identical requests race on real
/// concurrent connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pending_approvals_are_capped_per_caller_and_identical_requests_merge_postgres() {
    capped_and_merged(
        TestRegistry::postgres(with_limits(
            Duration::from_secs(900),
            3,
            Duration::from_secs(3600),
        ))
        .await,
    )
    .await;
}

async fn capped_and_merged(registry: TestRegistry) {
    let mut a = worker(&registry, "worker-a").await;
    let mut b = worker(&registry, "worker-b").await;

    // Identical requests, ten at once and then again: one approval.
    let mut racing = Vec::new();
    for _ in 0..10 {
        let mut client = a.clone();
        racing.push(tokio::spawn(async move {
            request_as(&mut client, CALLER_A, &arguments()).await
        }));
    }
    let mut ids = std::collections::BTreeSet::new();
    for task in racing {
        let approval = task.await.unwrap().unwrap();
        assert_eq!(approval.requested_by, CALLER_A);
        ids.insert(approval.approval_id);
    }
    assert_eq!(ids.len(), 1, "identical pending requests merged: {ids:?}");
    let first = ids.into_iter().next().unwrap();
    let again = request_as(&mut b, CALLER_A, &arguments()).await.unwrap();
    assert_eq!(again.approval_id, first, "merged across workers too");

    // Two more distinct calls reach the cap of 3; the fourth is refused.
    for n in 1..=2 {
        request_as(&mut a, CALLER_A, &json!({"n": n}))
            .await
            .unwrap();
    }
    let refused = request_as(&mut a, CALLER_A, &json!({"n": 3}))
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("max_pending_approvals") && refused.message().contains('3'),
        "{}",
        refused.message()
    );
    // An identical request at the cap still answers with its approval.
    let merged = request_as(&mut a, CALLER_A, &json!({"n": 1}))
        .await
        .unwrap();
    assert_eq!(merged.state, i32::from(pb::ApprovalState::Pending));
    // Another caller of the same worker is unaffected.
    let other = request_as(&mut a, CALLER_B, &arguments()).await.unwrap();
    assert_eq!(other.requested_by, CALLER_B);
    assert_ne!(other.approval_id, first, "another caller's call is its own");

    // A decision frees a slot; the decision names the credential, not the
    // client's x-quiver-actor header.
    let response = reqwest::Client::new()
        .post(format!("{}/admin/api/approvals/{first}", registry.http))
        .bearer_auth(APPROVER)
        .header("x-quiver-actor", "admin")
        .json(&json!({"decision": "deny"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let denied: Value = response.json().await.unwrap();
    assert_eq!(denied["decided_by"], "approver");
    request_as(&mut a, CALLER_A, &json!({"n": 3}))
        .await
        .unwrap();

    let (_, body) = rest(
        &registry,
        Method::GET,
        "/admin/api/approvals?state=pending",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(body["approvals"].as_array().unwrap().len(), 4, "{body}");
}

/// Issue #21 item 3: denied, used and expired approvals are deleted once
/// their retention after expiry has passed (by the registry's sweep);
/// live ones stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_approvals_are_purged_after_their_retention() {
    let registry = sqlite_registry(with_limits(
        Duration::from_millis(1200),
        100,
        Duration::from_secs(1),
    ))
    .await;
    let mut a = worker(&registry, "worker-a").await;
    let denied = requested(&mut a).await;
    assert_eq!(decide(&registry, ADMIN, &denied, "deny").await.0, 200);
    let path = format!("/admin/api/approvals/{denied}");
    assert_eq!(
        rest(&registry, Method::GET, &path, Some(ADMIN), None)
            .await
            .0,
        200
    );
    // Expiry (1.2 s) + retention (1 s) + one sweep period (1 s).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    loop {
        let (status, body) = rest(&registry, Method::GET, &path, Some(ADMIN), None).await;
        if status == 404 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "denied approval still kept: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A fresh one is kept.
    let live = requested_with(&mut a, &json!({"path": "/srv/new"})).await;
    let (status, _) = rest(
        &registry,
        Method::GET,
        &format!("/admin/api/approvals/{live}"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, 200);
}

/// Issue #21 item 3: a list shows large arguments as a preview with their
/// size and hash; one approval's GET shows them whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_summarise_large_arguments() {
    let registry = registry(Duration::from_secs(900)).await;
    let mut a = worker(&registry, "worker-a").await;
    let big = json!({"blob": "x".repeat(200 * 1024), "api_key": "sk-big"});
    for n in 0..5 {
        let mut arguments = big.clone();
        arguments["n"] = json!(n);
        requested_with(&mut a, &arguments).await;
    }
    let response = reqwest::Client::new()
        .get(format!("{}/admin/api/approvals", registry.http))
        .bearer_auth(APPROVER)
        .send()
        .await
        .unwrap();
    let text = response.text().await.unwrap();
    assert!(text.len() < 40 * 1024, "list of 5 is {} bytes", text.len());
    let list: Value = serde_json::from_str(&text).unwrap();
    let first = &list["approvals"][0];
    assert_eq!(first["arguments"], Value::Null);
    assert_eq!(first["arguments_truncated"], true);
    assert!(first["arguments_bytes"].as_u64().unwrap() > 200 * 1024);
    assert!(first["arguments_preview"].as_str().unwrap().len() <= 4096);
    assert!(
        !first["arguments_preview"]
            .as_str()
            .unwrap()
            .contains("sk-big")
    );
    assert_eq!(first["arguments_hash"].as_str().unwrap().len(), 64);
    let id = first["approval_id"].as_str().unwrap();
    let (status, one) = rest(
        &registry,
        Method::GET,
        &format!("/admin/api/approvals/{id}"),
        Some(APPROVER),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(one["arguments"]["blob"].as_str().unwrap().len(), 200 * 1024);
    assert_eq!(one["arguments"]["api_key"], "********");
}

/// Issue #21 item 7: the approver token reaches `whoami` and the approvals
/// routes only, whatever a record's id is: a record named `whoami` is not
/// readable with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approver_token_cannot_read_a_record_named_whoami() {
    let registry = registry(Duration::from_secs(900)).await;
    let record = json!({
        "server_id": "whoami",
        "transport": "stdio",
        "stdio": {"command": "true", "env": {"API_KEY": "sk-whoami"}},
        "allowed_tools": ["*"],
    });
    let (status, body) = rest(
        &registry,
        Method::POST,
        "/admin/api/mcp/servers",
        Some(ADMIN),
        Some(&record.to_string()),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    for path in [
        "/admin/api/mcp/servers/whoami",
        "/admin/api/mcp/servers/whoami/history",
    ] {
        let (status, body) = rest(&registry, Method::GET, path, Some(APPROVER), None).await;
        assert_eq!(status, 403, "{path}: {body}");
        assert_eq!(body["error"]["code"], "permission_denied");
    }
    let (status, body) = rest(
        &registry,
        Method::GET,
        "/admin/api/whoami",
        Some(APPROVER),
        None,
    )
    .await;
    assert_eq!((status, body["role"].as_str()), (200, Some("approver")));
    let (status, _) = rest(
        &registry,
        Method::GET,
        "/admin/api/mcp/servers/whoami",
        Some(WORKER),
        None,
    )
    .await;
    assert_eq!(status, 200, "the worker token still reads records");
}
