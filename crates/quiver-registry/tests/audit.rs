//! The audit trail over REST (`GET /admin/api/audit`): registry changes of
//! every record from the history table, newest first or paged oldest first
//! after a revision, with actors, kinds and the paths of the changed fields,
//! never values. The registry runs in-process on loopback ports.

mod common;

use common::{ADMIN, TestRegistry, WORKER, postgres_registry, rest, spec, sqlite_registry};
use quiver_model::Source;
use quiver_store::{Store, UpsertRequest};
use reqwest::Method;
use serde_json::{Value, json};

const SERVERS: &str = "/admin/api/mcp/servers";
const AUDIT: &str = "/admin/api/audit";

/// A REST write as `actor` (the `x-quiver-actor` header) with the admin
/// token; returns the status.
async fn write_as(
    registry: &TestRegistry,
    actor: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> u16 {
    let mut request = reqwest::Client::new()
        .request(method, registry.url(path))
        .bearer_auth(ADMIN)
        .header("x-quiver-actor", actor);
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    request.send().await.unwrap().status().as_u16()
}

/// The audit page at `query` read with `token`; panics unless 200.
async fn audit(registry: &TestRegistry, token: &str, query: &str) -> Value {
    let (status, body) = rest(
        registry,
        Method::GET,
        &format!("{AUDIT}{query}"),
        Some(token),
        None,
    )
    .await;
    assert_eq!(status, 200, "{query}: {body}");
    body
}

fn numbers(page: &Value, key: &str) -> Vec<u64> {
    page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e[key].as_u64().unwrap())
        .collect()
}

fn strings(page: &Value, key: &str) -> Vec<String> {
    page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e[key].as_str().unwrap().to_owned())
        .collect()
}

/// Revisions 1…7: alpha created (ann), beta created (bob), alpha edited
/// (carol: budget, display name, a secret env value), beta deleted (ann),
/// beta created again (bob), alpha rolled back to revision 1 (dave), beta
/// adopted unchanged by an `mcp.d` file.
async fn make_history(registry: &TestRegistry) {
    let alpha = spec("alpha", "npx");
    assert_eq!(
        write_as(registry, "ann", Method::POST, SERVERS, Some(json!(alpha))).await,
        201
    );
    let beta = spec("beta", "uvx");
    assert_eq!(
        write_as(registry, "bob", Method::POST, SERVERS, Some(json!(beta))).await,
        201
    );
    let mut edited = alpha.clone();
    edited.budgets.max_concurrency = 2;
    edited.display_name = Some("Alpha".into());
    if let Some(stdio) = edited.stdio.as_mut() {
        stdio.env.insert("API_KEY".into(), "sk-rotated".into());
    }
    assert_eq!(
        write_as(
            registry,
            "carol",
            Method::POST,
            SERVERS,
            Some(json!(edited))
        )
        .await,
        200
    );
    let beta_path = format!("{SERVERS}/beta");
    assert_eq!(
        write_as(registry, "ann", Method::DELETE, &beta_path, None).await,
        200
    );
    assert_eq!(
        write_as(registry, "bob", Method::POST, SERVERS, Some(json!(beta))).await,
        201
    );
    let rollback = format!("{SERVERS}/alpha/rollback");
    let body = json!({"revision": 1});
    assert_eq!(
        write_as(registry, "dave", Method::POST, &rollback, Some(body)).await,
        200
    );
    let adopted = registry
        .store
        .upsert(UpsertRequest {
            spec: beta,
            expected_revision: None,
            actor: "mcp.d".into(),
            source: Source::File("20-beta.toml".into()),
        })
        .await
        .unwrap();
    assert_eq!(adopted.server().revision, 7);
}

/// The whole trail, newest first, for either token.
async fn newest_first_with_actors_kinds_and_fields(registry: &TestRegistry) {
    make_history(registry).await;
    let page = audit(registry, ADMIN, "").await;
    assert_eq!(page["order"], "newest_first");
    assert_eq!(page["head_revision"], 7);
    assert_eq!(page["more"], false);
    assert_eq!(page["next_since_revision"], 7);
    assert_eq!(numbers(&page, "revision"), [7, 6, 5, 4, 3, 2, 1]);
    assert_eq!(
        strings(&page, "server_id"),
        ["beta", "alpha", "beta", "beta", "alpha", "beta", "alpha"]
    );
    assert_eq!(
        strings(&page, "actor"),
        ["mcp.d", "dave", "bob", "ann", "carol", "bob", "ann"]
    );
    assert_eq!(
        strings(&page, "kind"),
        [
            "upsert", "upsert", "upsert", "delete", "upsert", "upsert", "upsert"
        ]
    );
    assert_eq!(
        strings(&page, "source"),
        [
            "file:20-beta.toml",
            "admin",
            "admin",
            "admin",
            "admin",
            "admin",
            "admin"
        ]
    );
    let fields: Vec<Value> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["changed_fields"].clone())
        .collect();
    let edit = json!([
        "budgets.max_concurrency",
        "display_name",
        "stdio.env.API_KEY"
    ]);
    assert_eq!(
        fields,
        [
            json!(["(source)"]),
            edit.clone(),
            json!(["(created)"]),
            json!(["(deleted)"]),
            edit,
            json!(["(created)"]),
            json!(["(created)"]),
        ]
    );
    let previous: Vec<Value> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["previous_revision"].clone())
        .collect();
    assert_eq!(
        previous,
        [
            json!(5),
            json!(3),
            json!(4),
            json!(2),
            json!(1),
            Value::Null,
            Value::Null
        ]
    );
    assert!(page["entries"][0]["at"].as_str().unwrap().contains('T'));

    // Field paths only: no literal env value, no reference, for any token.
    let worker_page = audit(registry, WORKER, "").await;
    assert_eq!(worker_page, page);
    let text = page.to_string();
    for value in ["sk-literal", "sk-rotated", "${ENV:TOKEN}"] {
        assert!(!text.contains(value), "{value} in {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_lists_changes_newest_first_sqlite() {
    let registry = sqlite_registry(|_| {}).await;
    newest_first_with_actors_kinds_and_fields(&registry).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_lists_changes_newest_first_postgres() {
    let registry = postgres_registry().await;
    newest_first_with_actors_kinds_and_fields(&registry).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_pages_and_filters() {
    let registry = sqlite_registry(|_| {}).await;
    make_history(&registry).await;

    // Newest first, limited: the rest is older.
    let page = audit(&registry, ADMIN, "?limit=2").await;
    assert_eq!(numbers(&page, "revision"), [7, 6]);
    assert_eq!(page["more"], true);

    // Paging forward through everything, oldest first.
    let mut seen = Vec::new();
    let mut pages = 0;
    let mut since = 0;
    loop {
        let page = audit(
            &registry,
            WORKER,
            &format!("?since_revision={since}&limit=3"),
        )
        .await;
        assert_eq!(page["order"], "oldest_first");
        seen.extend(numbers(&page, "revision"));
        since = page["next_since_revision"].as_u64().unwrap();
        pages += 1;
        if page["more"] == false {
            break;
        }
    }
    assert_eq!(seen, (1..=7).collect::<Vec<_>>());
    assert_eq!((pages, since), (3, 7));
    // Following: nothing new yet, and the cursor stays.
    let tail = audit(&registry, ADMIN, "?since_revision=7").await;
    assert_eq!(numbers(&tail, "revision"), Vec::<u64>::new());
    assert_eq!(
        (tail["more"].clone(), tail["next_since_revision"].clone()),
        (json!(false), json!(7))
    );
    // An exact fit says there is nothing more.
    let fit = audit(&registry, ADMIN, "?since_revision=4&limit=3").await;
    assert_eq!(numbers(&fit, "revision"), [5, 6, 7]);
    assert_eq!(fit["more"], false);

    // One record; the diff is still against that record's previous revision.
    let alpha = audit(&registry, ADMIN, "?server_id=alpha").await;
    assert_eq!(numbers(&alpha, "revision"), [6, 3, 1]);
    let beta = audit(&registry, ADMIN, "?server_id=beta&since_revision=2&limit=2").await;
    assert_eq!(numbers(&beta, "revision"), [4, 5]);
    assert_eq!(numbers(&beta, "previous_revision"), [2, 4]);
    assert_eq!(beta["more"], true);
    let none = audit(&registry, ADMIN, "?server_id=never-existed").await;
    assert_eq!(none["entries"], json!([]));
    assert_eq!(
        (none["more"].clone(), none["next_since_revision"].clone()),
        (json!(false), json!(0))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_refuses_bad_queries_and_missing_tokens() {
    let registry = sqlite_registry(|_| {}).await;
    for (query, field) in [
        ("?limit=0", "limit"),
        ("?limit=1001", "limit"),
        ("?limit=ten", "limit"),
        ("?limit=-1", "limit"),
        ("?since_revision=-1", "since_revision"),
        ("?since_revision=abc", "since_revision"),
        ("?server_id=bad%20id", "server_id"),
        ("?server_id=", "server_id"),
        ("?sinceRevision=3", "sinceRevision"),
    ] {
        let (status, body) = rest(
            &registry,
            Method::GET,
            &format!("{AUDIT}{query}"),
            Some(ADMIN),
            None,
        )
        .await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"]["code"], "invalid_argument", "{query}: {body}");
        assert_eq!(body["error"]["field"], field, "{query}: {body}");
    }
    // The limits themselves are fine.
    audit(&registry, ADMIN, "?limit=1000&since_revision=0").await;
    audit(&registry, ADMIN, "?limit=1").await;

    let (status, body) = rest(&registry, Method::GET, AUDIT, None, None).await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = rest(&registry, Method::GET, AUDIT, Some("wrong"), None).await;
    assert_eq!(status, 401, "{body}");
}
