//! Tool search (issue #14): a chat request with `mcp.tool_search` offers the
//! search function and a few tools instead of the whole catalog; the model's
//! search for "add two numbers" finds server-everything's `get-sum` (the npm
//! reference server, a real process), the next request offers it and the
//! loop runs it. `GET /v1/mcp/tools?query=` is the same search. Real
//! `quiver registry` and `quiver worker`, the scripted upstream over HTTP.

use std::time::Duration;

use quiver_testkit::upstream::{Reply, Script, ScriptedUpstream};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{
    ADMIN, Admin, CALLER, RegistryProcess, WORKER, WorkerProcess, everything_record, injected,
    registry, sqlite, stdio_record,
};

const SEARCH: &str = "quiver_search_tools";

/// The function names a recorded upstream request offered.
fn offered(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

async fn get(worker: &WorkerProcess, query: &str) -> (StatusCode, Value) {
    let response = reqwest::Client::new()
        .get(format!("{}/v1/mcp/tools{query}", worker.url()))
        .bearer_auth(CALLER)
        .send()
        .await
        .expect("GET tools");
    let status = response.status();
    (status, response.json().await.expect("JSON"))
}

/// A registry on a fresh SQLite file holding `records`, the scripted
/// upstream with `script`, and a worker synced to both.
struct Setup {
    _dir: tempfile::TempDir,
    _registry: RegistryProcess,
    upstream: ScriptedUpstream,
    worker: WorkerProcess,
}

impl Setup {
    async fn start(records: Vec<Value>, script: Script) -> Setup {
        let (dir, db_url) = sqlite();
        let registry = registry(&db_url, None).await;
        let admin = Admin::new(&registry, ADMIN);
        let mut revision = 0;
        for record in records {
            revision = admin.upsert(record).await;
        }
        let upstream = ScriptedUpstream::start(script).await;
        let worker = WorkerProcess::start(
            &registry.grpc_url(),
            WORKER,
            CALLER,
            &["--upstream-url", &upstream.base_url()],
        )
        .await;
        worker.synced(revision, Duration::from_secs(10)).await;
        Setup {
            _dir: dir,
            _registry: registry,
            upstream,
            worker,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_finds_get_sum_which_the_next_request_offers_and_the_loop_runs() {
    // A second server the policy hides one tool of: search must not find it.
    let mut kit = stdio_record("kit", &["*"]);
    kit["denied_tools"] = json!(["add"]);
    let get_sum = injected("everything", "get-sum");
    let Setup {
        upstream, worker, ..
    } = Setup::start(
        vec![everything_record("everything", &["*"]), kit],
        Script::sequence([
            Reply::tool_call("s1", SEARCH, json!({"query": "add two numbers"})),
            Reply::tool_call("c1", &get_sum, json!({"a": 2, "b": 3})),
            Reply::text("2 + 3 = 5"),
        ]),
    )
    .await;

    // The whole catalog, and the same search over the tool API.
    let (status, catalog) = get(&worker, "").await;
    assert_eq!(status, StatusCode::OK, "{catalog}");
    let catalog: Vec<&str> = catalog
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(catalog.contains(&get_sum.as_str()), "{catalog:?}");
    assert!(!catalog.contains(&injected("kit", "add").as_str()));
    let (status, found) = get(&worker, "?query=add%20two%20numbers&limit=3").await;
    assert_eq!(status, StatusCode::OK, "{found}");
    assert_eq!(found[0]["name"], get_sum.as_str(), "{found}");
    assert!(found.as_array().expect("matches").len() <= 3, "{found}");
    let (status, refused) = get(&worker, "?query=x&limit=0").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert_eq!(refused["error"]["field"], "limit", "{refused}");

    let response = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", worker.url()))
        .bearer_auth(CALLER)
        .json(&json!({
            "model": "m",
            "messages": [{"role": "user", "content": "What is 2 plus 3?"}],
            "mcp": {"enabled": true, "tool_search": {"max_tools": 2}},
        }))
        .send()
        .await
        .expect("chat");
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.expect("chat JSON");
    assert_eq!(body["mcp"]["stop_reason"], "completed", "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "2 + 3 = 5");

    let requests = upstream.requests();
    assert_eq!(requests.len(), 3);
    // First request: the search function and at most two tools.
    let first = offered(&requests[0].body);
    assert_eq!(first[0], SEARCH, "{first:?}");
    assert!(first.len() <= 3 && first.len() < catalog.len(), "{first:?}");
    // The search's answer names get-sum, never the denied tool.
    let messages = requests[1].body["messages"].as_array().expect("messages");
    let answer = messages
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == "s1")
        .expect("the search's tool message");
    let answer: Value =
        serde_json::from_str(answer["content"].as_str().expect("text")).expect("JSON answer");
    let names: Vec<&str> = answer["tools"]
        .as_array()
        .expect("tools found")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names[0], get_sum, "{answer}");
    assert!(names.len() <= 2, "{answer}");
    // The second request offers it; the third carries its result.
    let second = offered(&requests[1].body);
    assert!(second.contains(&get_sum), "{second:?}");
    assert_eq!(second[0], SEARCH);
    let result = requests[2].body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == "c1")
        .expect("get-sum's tool message")
        .clone();
    assert!(
        result["content"].as_str().is_some_and(|t| t.contains('5')),
        "{result}"
    );
    // Found tools stay offered for the rest of the loop.
    assert!(offered(&requests[2].body).contains(&get_sum));
    let calls = body["mcp"]["calls"].as_array().expect("calls");
    assert_eq!(calls[0]["name"], SEARCH, "{body}");
    assert_eq!(calls[1]["tool"], "get-sum", "{body}");
    assert_eq!(calls[1]["status"], "ok", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tool_search_settings_name_their_field() {
    let Setup {
        upstream, worker, ..
    } = Setup::start(
        vec![stdio_record("kit", &["*"])],
        Script::sequence([Reply::text("unused")]),
    )
    .await;
    let chat = |mcp: Value, tools: Value| {
        let url = format!("{}/v1/chat/completions", worker.url());
        async move {
            let response = reqwest::Client::new()
                .post(url)
                .bearer_auth(CALLER)
                .json(&json!({
                    "model": "m",
                    "messages": [{"role": "user", "content": "hi"}],
                    "tools": tools,
                    "mcp": mcp,
                }))
                .send()
                .await
                .expect("chat");
            let status = response.status();
            (status, response.json::<Value>().await.expect("JSON"))
        }
    };
    let (status, body) = chat(
        json!({"enabled": true, "tool_search": {"max_tools": 0}}),
        json!([]),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(
        body["error"]["field"], "mcp.tool_search.max_tools",
        "{body}"
    );
    let (status, body) = chat(json!({"enabled": true, "tool_search": "yes"}), json!([])).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "mcp.tool_search", "{body}");
    // The caller's own tool may not take the search function's name.
    let own = json!([{"type": "function", "function": {"name": SEARCH, "parameters": {"type": "object"}}}]);
    let (status, body) = chat(json!({"enabled": true, "tool_search": true}), own).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "tools", "{body}");
    assert_eq!(upstream.requests().len(), 0);
}
