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
    }
}

fn use_of(approval_id: &str, arguments: &Value) -> pb::UseApprovalRequest {
    let request = request(arguments);
    pb::UseApprovalRequest {
        approval_id: approval_id.into(),
        task: request.task,
        server_id: request.server_id,
        tool: request.tool,
        arguments_hash: request.arguments_hash,
        record_revision: request.record_revision,
    }
}

async fn requested(client: &mut ApprovalClient) -> String {
    let approval = client
        .request_approval(request(&arguments()))
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    assert_eq!(approval.state, i32::from(pb::ApprovalState::Pending));
    assert_eq!(approval.requested_by, "worker-a");
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
    let pending = requested(&mut a).await;
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
