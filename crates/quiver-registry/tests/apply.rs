//! Batch writes (issue #16): `ApplyMcpServers` over gRPC and `POST
//! /admin/api/servers/apply` over REST, on both stores. One transaction, one
//! contiguous revision range, all or nothing, errors naming the record, and
//! a watch stream sees every revision of the batch.

mod common;

use std::time::Duration;

use common::{ADMIN, TestRegistry, WORKER, postgres_registry, rest, spec, sqlite_registry};
use quiver_proto::v1 as pb;
use quiver_store::Store;
use reqwest::Method;
use serde_json::{Value, json};
use tonic::Code;

fn entry(id: &str, command: &str, expected_revision: Option<u64>) -> pb::UpsertMcpServerRequest {
    pb::UpsertMcpServerRequest {
        server: Some((&spec(id, command)).into()),
        expected_revision,
    }
}

/// Next non-heartbeat event of a gRPC watch stream, with a deadline.
async fn next_change(
    stream: &mut tonic::Streaming<pb::WatchMcpServersResponse>,
) -> pb::WatchMcpServersResponse {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .expect("no watch event within 5 s")
            .unwrap()
            .expect("watch stream ended");
        if !event.heartbeat {
            return event;
        }
    }
}

async fn grpc_batch_is_one_range_and_all_or_nothing(r: TestRegistry) {
    let mut admin = r.client(Some(ADMIN)).await;
    admin
        .upsert_mcp_server(entry("a", "x", None))
        .await
        .unwrap();
    let mut watcher = r.client(Some(WORKER)).await;
    let mut stream = watcher
        .watch_mcp_servers(pb::WatchMcpServersRequest { since_revision: 1 })
        .await
        .unwrap()
        .into_inner();

    let response = admin
        .apply_mcp_servers(pb::ApplyMcpServersRequest {
            servers: vec![
                entry("b", "y", Some(0)),
                entry("c", "z", None),
                entry("a", "changed", Some(1)),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((response.first_revision, response.last_revision), (2, 4));
    let revisions: Vec<u64> = response
        .results
        .iter()
        .map(|r| r.server.as_ref().unwrap().revision)
        .collect();
    assert_eq!(revisions, [2, 3, 4]);
    assert!(response.results.iter().all(|r| !r.unchanged));
    // The watch sees each revision of the batch, in order.
    for (revision, id) in [(2, "b"), (3, "c"), (4, "a")] {
        let event = next_change(&mut stream).await;
        assert_eq!(
            (event.revision, event.upserts.as_slice()),
            (revision, &[id.to_owned()][..])
        );
    }

    // A conflict on the second record: nothing written, the record named.
    let err = admin
        .apply_mcp_servers(pb::ApplyMcpServersRequest {
            servers: vec![entry("d", "x", None), entry("b", "changed", Some(1))],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted, "{}", err.message());
    assert!(
        err.message().starts_with("servers[1]: "),
        "{}",
        err.message()
    );
    // An invalid third record: named by its field.
    let mut bad = spec("e", "x");
    bad.stdio.as_mut().unwrap().command = " ".into();
    let err = admin
        .apply_mcp_servers(pb::ApplyMcpServersRequest {
            servers: vec![
                entry("d", "x", None),
                entry("e2", "x", None),
                pb::UpsertMcpServerRequest {
                    server: Some((&bad).into()),
                    expected_revision: None,
                },
            ],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().starts_with("servers[2].stdio.command"),
        "{}",
        err.message()
    );
    // A repeated id.
    let err = admin
        .apply_mcp_servers(pb::ApplyMcpServersRequest {
            servers: vec![entry("d", "x", None), entry("d", "y", None)],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().starts_with("servers[1].server_id"),
        "{}",
        err.message()
    );
    assert_eq!(r.store.head().await.unwrap().revision, 4);
    assert!(r.store.get("d").await.unwrap().is_none());

    // Writes need the admin token.
    let err = watcher
        .apply_mcp_servers(pb::ApplyMcpServersRequest {
            servers: vec![entry("d", "x", None)],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
}

async fn rest_batch_is_one_range_and_all_or_nothing(r: TestRegistry) {
    let record = |id: &str, command: &str| json!({"server_id": id, "transport": "stdio", "stdio": {"command": command}});
    let apply = |body: Value| {
        let r = &r;
        async move {
            rest(
                r,
                Method::POST,
                "/admin/api/servers/apply",
                Some(ADMIN),
                Some(&body.to_string()),
            )
            .await
        }
    };
    let (status, body) = apply(json!({"servers": [record("a", "x"), record("b", "x")]})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (&body["first_revision"], &body["last_revision"]),
        (&json!(1), &json!(2))
    );
    assert_eq!(
        body["results"][1],
        json!({"server_id": "b", "outcome": "created", "revision": 2})
    );

    let (status, body) = apply(json!({
        "servers": [record("a", "x"), record("b", "y"), record("c", "z")],
        "expected_revisions": {"b": 2, "c": 0},
    }))
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (
                r["outcome"].as_str().unwrap(),
                r["revision"].as_u64().unwrap()
            ))
            .collect::<Vec<_>>(),
        [("unchanged", 1), ("updated", 3), ("created", 4)]
    );
    assert_eq!(
        (&body["first_revision"], &body["last_revision"]),
        (&json!(3), &json!(4))
    );

    // A stale expected revision: 409 naming the record, nothing written.
    let (status, body) = apply(json!({
        "servers": [record("d", "x"), record("b", "z")],
        "expected_revisions": {"b": 2},
    }))
    .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "conflict");
    assert_eq!(body["error"]["index"], 1);
    assert_eq!(body["error"]["current_revision"], 3);
    // An invalid record: 400 naming its field.
    let (status, body) = apply(json!({
        "servers": [record("d", "x"), {"server_id": "e", "transport": "stdio", "stdio": {"command": "x"}, "typo": 1}],
    }))
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["field"], "servers[1].typo");
    let (status, body) = apply(json!({"records": []})).await;
    assert_eq!((status, &body["error"]["field"]), (400, &json!("servers")));
    assert_eq!(r.store.head().await.unwrap().revision, 4);
    assert!(r.store.get("d").await.unwrap().is_none());

    // Masked values keep the stored ones.
    let with_secret = spec("s", "x");
    let (status, body) = apply(json!({"servers": [json!(with_secret)]})).await;
    assert_eq!(status, 200, "{body}");
    let mut masked = json!(with_secret);
    masked["stdio"]["env"]["API_KEY"] = json!(quiver_model::MASK);
    masked["display_name"] = json!("Secret keeper");
    let (status, body) = apply(json!({"servers": [masked]})).await;
    assert_eq!(status, 200, "{body}");
    let stored = r.store.get("s").await.unwrap().unwrap();
    assert_eq!(stored.spec.stdio.unwrap().env["API_KEY"], "sk-literal");
    assert_eq!(stored.spec.display_name.as_deref(), Some("Secret keeper"));

    // Admin only.
    let (status, _) = rest(
        &r,
        Method::POST,
        "/admin/api/servers/apply",
        Some(WORKER),
        Some(&json!({"servers": []}).to_string()),
    )
    .await;
    assert_eq!(status, 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_apply_on_sqlite() {
    grpc_batch_is_one_range_and_all_or_nothing(sqlite_registry(|_| {}).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_apply_on_postgres() {
    grpc_batch_is_one_range_and_all_or_nothing(postgres_registry().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_apply_on_sqlite() {
    rest_batch_is_one_range_and_all_or_nothing(sqlite_registry(|_| {}).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_apply_on_postgres() {
    rest_batch_is_one_range_and_all_or_nothing(postgres_registry().await).await;
}
