//! The fleet as an MCP sub-registry (issue #26, docs/reference.md §13.8):
//! `/v0.1/servers` in the official registry's v0.1 shapes, checked against
//! the official schemas (vendored in `tests/data`, see its README), paging,
//! filters, who may read, and refusals.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{ADMIN, TestRegistry, WORKER, rest, spec, sqlite_registry};
use quiver_model::{Source, StoredServer};
use quiver_registry::RegistryOptions;
use quiver_store::{Store, UpsertRequest};
use reqwest::Method;
use serde_json::{Value, json};

const WORKER_URL: &str = "https://gateway.example.com/fleet";
const SERVER_SCHEMA: &str = include_str!("data/server.schema.json");
const LIST_SCHEMA: &str = include_str!("data/server-list.schema.json");
const SERVER_SCHEMA_ID: &str =
    "https://static.modelcontextprotocol.io/schemas/2025-10-17/server.schema.json";

/// Validators of one entry's `server` and of a whole list response.
struct Schemas {
    server: jsonschema::Validator,
    list: jsonschema::Validator,
}

impl Schemas {
    fn load() -> Schemas {
        let server: Value = serde_json::from_str(SERVER_SCHEMA).unwrap();
        assert_eq!(
            server["$id"], SERVER_SCHEMA_ID,
            "the schema frozen with v0.1"
        );
        let list: Value = serde_json::from_str(LIST_SCHEMA).unwrap();
        let registry = jsonschema::Registry::new()
            .add(SERVER_SCHEMA_ID, server.clone())
            .unwrap()
            .prepare()
            .unwrap();
        let options = || jsonschema::options().should_validate_formats(true);
        Schemas {
            server: options().build(&server).unwrap(),
            list: options().with_registry(&registry).build(&list).unwrap(),
        }
    }

    /// Panics naming every schema error of a list response and of each of
    /// its entries.
    fn check_list(&self, body: &Value) {
        let errors: Vec<String> = self
            .list
            .iter_errors(body)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "list response: {errors:?}\n{body:#}");
        for entry in body["servers"].as_array().unwrap() {
            self.check_server(&entry["server"]);
        }
    }

    fn check_server(&self, server: &Value) {
        let errors: Vec<String> = self
            .server
            .iter_errors(server)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "entry: {errors:?}\n{server:#}");
    }
}

async fn registry(tweak: impl FnOnce(&mut RegistryOptions)) -> TestRegistry {
    sqlite_registry(|options| {
        options.catalog.worker_url = Some(format!("{WORKER_URL}/"));
        tweak(options);
    })
    .await
}

async fn write(r: &TestRegistry, spec: quiver_model::McpServerSpec) -> StoredServer {
    r.store
        .upsert(UpsertRequest {
            spec,
            expected_revision: None,
            actor: "test".into(),
            source: Source::Api,
        })
        .await
        .unwrap()
        .into_server()
}

async fn get(r: &TestRegistry, path: &str, token: Option<&str>) -> (u16, Value) {
    rest(r, Method::GET, path, token, None).await
}

fn names(body: &Value) -> Vec<String> {
    body["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["server"]["name"].as_str().unwrap().to_owned())
        .collect()
}

fn encoded(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_are_official_server_json_of_the_enabled_records() {
    let schemas = Schemas::load();
    let r = registry(|_| {}).await;
    let mut files = spec("files", "npx");
    files.display_name = Some("Team files".into());
    files.labels.insert("description".into(), "é".repeat(150));
    let files = write(&r, files).await;
    let plain = write(&r, spec("plain_one-2", "uvx")).await;
    let mut off = spec("off", "npx");
    off.enabled = false;
    write(&r, off).await;

    let (status, body) = get(&r, "/v0.1/servers", Some(ADMIN)).await;
    assert_eq!(status, 200, "{body}");
    schemas.check_list(&body);
    assert_eq!(
        names(&body),
        ["local.quiver/files", "local.quiver/plain_one-2"],
        "the disabled record is absent"
    );
    assert_eq!(body["metadata"], json!({"count": 2}), "one page: no cursor");

    // The schemas are not vacuous: a name without a namespace, a long
    // title and an unknown official field are refused.
    let mut bad = body.clone();
    bad["servers"][0]["server"]["name"] = json!("files");
    assert!(!schemas.server.is_valid(&bad["servers"][0]["server"]));
    bad["servers"][0]["server"]["name"] = json!("local.quiver/files");
    bad["servers"][0]["server"]["title"] = json!("t".repeat(101));
    assert!(!schemas.list.is_valid(&bad));
    let mut bad = body.clone();
    bad["servers"][0]["_meta"]["io.modelcontextprotocol.registry/official"]["extra"] = json!(1);
    assert!(!schemas.list.is_valid(&bad));

    let entry = &body["servers"][0];
    assert_eq!(entry["server"]["title"], "Team files");
    assert_eq!(
        entry["server"]["description"].as_str().unwrap(),
        "é".repeat(100),
        "the description label, cut to the schema's 100 characters"
    );
    assert_eq!(
        entry["server"]["version"],
        format!("1.0.{}", files.revision)
    );
    assert_eq!(
        entry["server"]["remotes"],
        json!([{
            "type": "streamable-http",
            "url": format!("{WORKER_URL}/mcp/files"),
            "headers": [{
                "name": "Authorization",
                "description": "Bearer followed by a caller credential of this fleet (an API key or a token of its identity provider)",
                "isRequired": true,
                "isSecret": true,
            }],
        }]),
        "the gateway's remote, asking importers for a caller credential"
    );
    let official = &entry["_meta"]["io.modelcontextprotocol.registry/official"];
    assert_eq!(official["status"], "active");
    assert_eq!(official["isLatest"], true);
    let updated: chrono::DateTime<chrono::Utc> =
        official["updatedAt"].as_str().unwrap().parse().unwrap();
    assert_eq!(updated, files.updated_at, "full precision");
    let second = &body["servers"][1]["server"];
    assert!(second.get("title").is_none(), "no display name: no title");
    assert_eq!(
        second["description"],
        "MCP server plain_one-2 via the Quiver gateway"
    );

    // A change is a new version.
    let mut changed = spec("plain_one-2", "uvx");
    changed.display_name = Some("Plain".into());
    let changed = write(&r, changed).await;
    assert!(changed.revision > plain.revision);
    let path = format!(
        "/v0.1/servers/{}/versions",
        encoded("local.quiver/plain_one-2")
    );
    let (status, versions) = get(&r, &path, Some(ADMIN)).await;
    assert_eq!(status, 200, "{versions}");
    schemas.check_list(&versions);
    assert_eq!(versions["metadata"]["count"], 1);
    let version = format!("1.0.{}", changed.revision);
    assert_eq!(versions["servers"][0]["server"]["version"], version);
    for asked in ["latest", version.as_str()] {
        let (status, one) = get(&r, &format!("{path}/{asked}"), Some(ADMIN)).await;
        assert_eq!(status, 200, "{asked}: {one}");
        schemas.check_list(&json!({"servers": [one.clone()]}));
        assert_eq!(one["server"]["title"], "Plain");
        assert_eq!(one["server"]["version"], version);
    }
    let (status, _) = get(&r, "/v0.1/servers?version=latest", Some(ADMIN)).await;
    assert_eq!(status, 200);
    let (_, exact) = get(&r, &format!("/v0.1/servers?version={version}"), Some(ADMIN)).await;
    assert_eq!(names(&exact), ["local.quiver/plain_one-2"]);

    let old = format!("1.0.{}", plain.revision);
    for missing in [
        format!("{path}/{old}"),
        format!("/v0.1/servers/{}/versions", encoded("local.quiver/off")),
        format!(
            "/v0.1/servers/{}/versions/latest",
            encoded("local.quiver/off")
        ),
        format!("/v0.1/servers/{}/versions", encoded("other.ns/files")),
        format!("/v0.1/servers/{}/versions", encoded("local.quiver/nope")),
    ] {
        let (status, error) = get(&r, &missing, Some(ADMIN)).await;
        assert_eq!(status, 404, "{missing}: {error}");
        assert_eq!(error["error"]["code"], "not_found", "{missing}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_over_a_thousand_records_returns_each_once_in_order() {
    let schemas = Schemas::load();
    let r = registry(|options| {
        options.catalog.namespace = "com.example.fleet".into();
    })
    .await;
    // Ids in an order unlike their names' (and some disabled between).
    let requests: Vec<UpsertRequest> = (0..1_050)
        .map(|i| {
            let mut spec = spec(&format!("srv-{:04}", (i * 7919) % 1_050), "npx");
            spec.enabled = i % 21 != 0;
            UpsertRequest {
                spec,
                expected_revision: None,
                actor: "test".into(),
                source: Source::Api,
            }
        })
        .collect();
    let written = r.store.apply(requests).await.unwrap();
    let expected: Vec<String> = written
        .into_iter()
        .map(|o| o.into_server())
        .filter(|s| s.spec.enabled)
        .map(|s| format!("com.example.fleet/{}", s.spec.server_id))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(expected.len(), 1_000);

    for limit in [None, Some(100), Some(7)] {
        let mut seen = Vec::new();
        let mut cursor: Option<String> = None;
        let mut pages = 0;
        loop {
            let mut path = "/v0.1/servers?".to_owned();
            if let Some(limit) = limit {
                path += &format!("limit={limit}&");
            }
            if let Some(cursor) = &cursor {
                path += &format!("cursor={}", encoded(cursor));
            }
            let (status, body) = get(&r, &path, Some(WORKER)).await;
            assert_eq!(status, 200, "{path}: {body}");
            if pages == 0 {
                schemas.check_list(&body);
            }
            pages += 1;
            let page = names(&body);
            let size = limit.unwrap_or(30);
            assert!(page.len() <= size);
            assert_eq!(body["metadata"]["count"], page.len());
            seen.extend(page);
            match body["metadata"]["nextCursor"].as_str() {
                Some(next) => {
                    assert_eq!(Some(next), seen.last().map(String::as_str));
                    cursor = Some(next.to_owned());
                }
                None => break,
            }
        }
        assert_eq!(seen, expected, "limit {limit:?}: each once, in name order");
        assert_eq!(pages, 1_000_usize.div_ceil(limit.unwrap_or(30)));
    }

    // A cursor stays valid when its record is deleted or one is created
    // before it: the rest of the walk neither repeats nor skips.
    let (_, first) = get(&r, "/v0.1/servers?limit=100", Some(ADMIN)).await;
    let cursor = first["metadata"]["nextCursor"].as_str().unwrap().to_owned();
    r.store
        .delete(quiver_store::DeleteRequest {
            server_id: cursor.split_once('/').unwrap().1.to_owned(),
            expected_revision: None,
            actor: "test".into(),
            source: Source::Api,
        })
        .await
        .unwrap();
    write(&r, spec("srv-0000-new", "npx")).await;
    let (_, rest_of) = get(
        &r,
        &format!("/v0.1/servers?limit=100&cursor={}", encoded(&cursor)),
        Some(ADMIN),
    )
    .await;
    assert_eq!(names(&rest_of), expected[100..200]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_and_updated_since_narrow_the_list() {
    let r = registry(|_| {}).await;
    let mut mail = spec("beta-mail", "npx");
    mail.labels
        .insert("description".into(), "Sends MAIL for the team".into());
    write(&r, mail.clone()).await;
    let mut files = spec("alpha-files", "npx");
    files.display_name = Some("Shared Drive".into());
    let files = write(&r, files).await;
    let mut hidden = spec("delta-drive", "npx");
    hidden.enabled = false;
    write(&r, hidden).await;
    // Later changes: an update and a creation.
    tokio::time::sleep(Duration::from_millis(20)).await;
    mail.display_name = Some("Mail".into());
    write(&r, mail).await;
    write(&r, spec("gamma", "npx")).await;

    let list = |query: String| {
        let r = &r;
        async move {
            let (status, body) = get(r, &format!("/v0.1/servers?{query}"), Some(ADMIN)).await;
            assert_eq!(status, 200, "{query}: {body}");
            names(&body)
        }
    };
    assert_eq!(
        list("search=shared%20DRIVE".into()).await,
        ["local.quiver/alpha-files"],
        "the title, case-insensitively; not the disabled delta-drive"
    );
    assert_eq!(
        list("search=sends+mail".into()).await,
        ["local.quiver/beta-mail"],
        "the description"
    );
    assert_eq!(
        list("search=GAMM".into()).await,
        ["local.quiver/gamma"],
        "the name"
    );
    assert_eq!(list("search=local.quiver%2F".into()).await.len(), 3);
    assert!(list("search=nothing-like-it".into()).await.is_empty());

    let since = encoded(&files.updated_at.to_rfc3339());
    assert_eq!(
        list(format!("updated_since={since}")).await,
        ["local.quiver/beta-mail", "local.quiver/gamma"],
        "updated after alpha-files was written: not alpha-files itself"
    );
    assert_eq!(
        list(format!("updated_since={since}&search=mail")).await,
        ["local.quiver/beta-mail"]
    );
    let before = encoded("2000-01-01T00:00:00+02:00");
    assert_eq!(list(format!("updated_since={before}")).await.len(), 3);
    let after = encoded("2999-01-01T00:00:00Z");
    assert!(list(format!("updated_since={after}")).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_need_a_credential_unless_anonymous() {
    let r = registry(|options| {
        options.auth.viewer_token = Some("viewer-secret".into());
        options.approvals.approver_token = Some("approver-secret".into());
    })
    .await;
    write(&r, spec("files", "npx")).await;
    let (status, body) = get(&r, "/v0.1/servers", None).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["code"], "unauthenticated");
    let (status, _) = get(&r, "/v0.1/servers", Some("wrong")).await;
    assert_eq!(status, 401);
    let (status, _) = get(&r, "/v0.1/servers", Some("qk_not-a-key")).await;
    assert_eq!(status, 401);
    let path = format!(
        "/v0.1/servers/{}/versions/latest",
        encoded("local.quiver/files")
    );
    let (status, _) = get(&r, &path, None).await;
    assert_eq!(status, 401, "every route");

    for token in [ADMIN, WORKER, "viewer-secret", "approver-secret"] {
        let (status, body) = get(&r, "/v0.1/servers", Some(token)).await;
        assert_eq!(
            (status, body["metadata"]["count"].clone()),
            (200, json!(1)),
            "{token}"
        );
    }

    // API keys: a caller credential (no roles) and one with roles.
    let (status, body) = rest(
        &r,
        Method::PUT,
        "/admin/api/policies/callers",
        Some(ADMIN),
        Some(&json!({"allowed_server_ids": ["files"]}).to_string()),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    for roles in [json!([]), json!(["viewer"])] {
        let (status, created) = rest(
            &r,
            Method::POST,
            "/admin/api/keys",
            Some(ADMIN),
            Some(&json!({"name": "ide", "policy": "callers", "roles": roles}).to_string()),
        )
        .await;
        assert_eq!(status, 201, "{created}");
        let key = created["key"].as_str().unwrap();
        let (status, body) = get(&r, &path, Some(key)).await;
        assert_eq!(status, 200, "key with roles {roles}: {body}");
        assert_eq!(body["server"]["name"], "local.quiver/files");
    }

    let open = registry(|options| options.catalog.anonymous = true).await;
    write(&open, spec("files", "npx")).await;
    let (status, body) = get(&open, "/v0.1/servers", None).await;
    assert_eq!((status, body["metadata"]["count"].clone()), (200, json!(1)));
    let (status, _) = get(&open, "/admin/api/mcp/servers", None).await;
    assert_eq!(status, 401, "only the catalog is open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_parameters_and_settings_are_refused_naming_them() {
    let r = registry(|_| {}).await;
    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("limit=ten", "limit"),
        ("limit=5&limit=6", "limit"),
        ("updated_since=yesterday", "updated_since"),
        ("updated_since=2025-13-01T00:00:00Z", "updated_since"),
        ("cursor=other.ns%2Ffiles", "cursor"),
    ] {
        let (status, body) = get(&r, &format!("/v0.1/servers?{query}"), Some(ADMIN)).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"]["code"], "invalid_argument", "{query}");
        assert_eq!(body["error"]["field"], field, "{query}: {body}");
    }
    let (status, _) = get(&r, "/v0.1/servers?limit=100", Some(ADMIN)).await;
    assert_eq!(status, 200);

    // No worker URL: nothing to point remotes at.
    let bare = sqlite_registry(|_| {}).await;
    let (status, body) = get(&bare, "/v0.1/servers", Some(ADMIN)).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--catalog-worker-url"),
        "{body}"
    );

    // A namespace that is not reverse-DNS stops start-up.
    let mut options = quiver_testkit::registry::test_options();
    options.catalog.namespace = "quiver".into();
    let dir = tempfile::tempdir().unwrap();
    let store = quiver_store::SqlStore::open_sqlite(&format!(
        "sqlite://{}",
        dir.path().join("registry.db").display()
    ))
    .await
    .unwrap();
    let started = quiver_registry::Registry::start(
        std::sync::Arc::new(store),
        options,
        tokio_util::sync::CancellationToken::new(),
    )
    .await;
    let err = started
        .err()
        .expect("a bad namespace is refused")
        .to_string();
    assert!(err.contains("reverse-DNS"), "{err}");
}
