//! `allowed_resources` against URIs that climb out of what they allow
//! (issue #21 item 4, docs/reference.md §13.5), and completion values of an
//! allowed resource template (item 8). A raw JSON-RPC stdio server
//! (`tests/e2e/peers/resource_log.py`) logs every request it receives; raw
//! HTTP clients speak JSON-RPC to `/mcp/{id}` and `/mcp` of a real worker.
//! Every trick URI is refused by the gateway and none reaches the server.

use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{CALLER, peer};
use crate::openai_sdk::sdk_python;
use crate::stack::Stack;

/// URIs a glob `file:///data/*` matches as text that name something
/// outside `/data` (or whose meaning depends on how the server decodes).
const TRICKS: &[&str] = &[
    "file:///data/../secret/key.txt",
    "file:///data/./../secret/key.txt",
    "file:///data/%2e%2e/secret/key.txt",
    "file:///data/%2E%2E/secret/key.txt",
    "file:///data/.%2e/secret/key.txt",
    "file:///data/..%2fsecret/key.txt",
    "file:///data/..%2Fsecret%2Fkey.txt",
    "file:///data/%252e%252e/secret/key.txt",
    "file:///data/sub/..%252f..%252fsecret/key.txt",
    "file:///data//../secret/key.txt",
    "file:///data//secret/key.txt",
    "file:///data/..\\secret\\key.txt",
    "file:///data/%5c..%5csecret%5ckey.txt",
    "file:///data/key.txt\u{0}.md",
    "file:///data/key%00.txt",
    "file:///data/key\n.txt",
    "file:///data/key%0d%0a.txt",
    "file:///data/key\u{85}.txt",
    "file:///data/key%zz.txt",
    "file:///data/key%",
    "file:///data/%c0%ae%c0%ae/secret/key.txt",
    "file:///data/..?x=1",
    "file:///data/..#frag",
    "file:///data/x?path=/../../secret/key.txt",
    "file:///data/..;/secret/key.txt",
    "file:///data/.. /secret/key.txt",
];

/// The allowed resource, which must still work.
const NOTES: &str = "file:///data/notes.md";

/// A stack with the logging server as `files`.
async fn start() -> Stack {
    let builder = Stack::builder();
    let log = requests_log(builder.dir());
    builder
        .record(json!({
            "server_id": "files",
            "transport": "stdio",
            "stdio": {
                "command": sdk_python(),
                "args": [peer("resource_log.py"), log.display().to_string()],
            },
            "allowed_tools": [],
            "allowed_resources": ["file:///data/*"],
            "allowed_prompts": ["greet"],
        }))
        .start()
        .await
}

/// Where the server logs the requests it receives.
fn requests_log(dir: &Path) -> PathBuf {
    dir.join("requests.jsonl")
}

/// Every request the server received, as JSON.
fn received(stack: &Stack) -> Vec<Value> {
    let text = std::fs::read_to_string(requests_log(stack.dir())).unwrap_or_default();
    text.lines()
        .map(|line| serde_json::from_str(line).expect("the server logs JSON lines"))
        .collect()
}

/// A raw MCP session on one endpoint.
struct Session {
    url: String,
    id: String,
    next: u64,
}

impl Session {
    async fn open(url: String) -> Session {
        let response = post(&url, None, &json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}},
        }))
        .await;
        assert_eq!(response.status(), StatusCode::OK, "initialize on {url}");
        let id = response.headers()["mcp-session-id"]
            .to_str()
            .expect("ascii")
            .to_owned();
        let _ = response.text().await;
        let initialized = post(
            &url,
            Some(&id),
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        )
        .await;
        assert!(initialized.status().is_success());
        Session { url, id, next: 1 }
    }

    /// Sends a request; its JSON-RPC answer (`result` or `error`).
    async fn request(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        let response = post(
            &self.url,
            Some(&self.id),
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )
        .await;
        assert_eq!(response.status(), StatusCode::OK, "{method}");
        let text = response.text().await.expect("body");
        // Streamable HTTP answers as JSON or as an SSE stream of messages.
        let messages: Vec<Value> = if text.trim_start().starts_with('{') {
            vec![serde_json::from_str(&text).expect("JSON answer")]
        } else {
            text.lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .filter_map(|data| serde_json::from_str(data.trim()).ok())
                .collect()
        };
        messages
            .into_iter()
            .find(|message| message["id"] == id)
            .unwrap_or_else(|| panic!("no answer to {method} in {text}"))
    }
}

async fn post(url: &str, session: Option<&str>, body: &Value) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .post(url)
        .bearer_auth(CALLER)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .timeout(Duration::from_secs(20))
        .body(body.to_string());
    if let Some(session) = session {
        request = request
            .header("mcp-session-id", session)
            .header("mcp-protocol-version", "2025-11-25");
    }
    request.send().await.expect("POST")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uris_climbing_out_of_allowed_resources_never_reach_the_server() {
    let stack = start().await;
    let mut one = Session::open(format!("{}/mcp/files", stack.worker.url())).await;
    let mut catalog = Session::open(format!("{}/mcp", stack.worker.url())).await;

    for uri in TRICKS {
        for (endpoint, session) in [("/mcp/files", &mut one), ("/mcp", &mut catalog)] {
            let read = session.request("resources/read", json!({"uri": uri})).await;
            assert!(
                read.get("result").is_none(),
                "{endpoint} read {uri:?}: {read}"
            );
            assert_eq!(
                read["error"]["code"], -32602,
                "{endpoint} read {uri:?}: {read}"
            );
            assert!(
                read["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("refused") && m.contains("§13.5")),
                "{read}"
            );
        }
        for method in ["resources/subscribe", "resources/unsubscribe"] {
            let answer = one.request(method, json!({"uri": uri})).await;
            assert!(answer.get("error").is_some(), "{method} {uri:?}: {answer}");
        }
    }
    // The allowed resource still reads, on both endpoints, and subscribes.
    for session in [&mut one, &mut catalog] {
        let read = session
            .request("resources/read", json!({"uri": NOTES}))
            .await;
        assert_eq!(
            read["result"]["contents"][0]["text"],
            format!("content of {NOTES}"),
            "{read}"
        );
    }
    let subscribed = one
        .request("resources/subscribe", json!({"uri": NOTES}))
        .await;
    assert!(subscribed.get("result").is_some(), "{subscribed}");
    // Listings leave the climbing URI out.
    let listed = one.request("resources/list", json!({})).await;
    let uris: Vec<&str> = listed["result"]["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(|r| r["uri"].as_str())
        .collect();
    assert_eq!(uris, [NOTES], "{listed}");

    // What reached the server: only the allowed URI, ever.
    let received = received(&stack);
    let resource_requests: Vec<&Value> = received
        .iter()
        .filter(|r| {
            r["method"]
                .as_str()
                .is_some_and(|m| m.starts_with("resources/") && m != "resources/list")
        })
        .collect();
    assert_eq!(resource_requests.len(), 3, "{received:#?}");
    for request in &resource_requests {
        assert_eq!(request["params"]["uri"], NOTES, "{request}");
    }
    let everything = serde_json::to_string(&received).expect("JSON");
    for uri in TRICKS {
        assert!(
            !everything.contains(&serde_json::to_string(uri).expect("JSON")),
            "{uri:?} reached the server"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_values_naming_refused_resources_are_left_out() {
    let stack = start().await;
    let mut one = Session::open(format!("{}/mcp/files", stack.worker.url())).await;

    // The template is allowed; of its `name` values, those whose URI
    // (`file:///data/{name}`, filled as RFC 6570 says) would be refused go.
    let completed = one
        .request(
            "completion/complete",
            json!({
                "ref": {"type": "ref/resource", "uri": "file:///data/{name}"},
                "argument": {"name": "name", "value": ""},
            }),
        )
        .await;
    assert_eq!(
        completed["result"]["completion"]["values"],
        json!(["notes.md", "sub/ok.md"]),
        "{completed}"
    );
    assert_eq!(completed["result"]["completion"]["total"], 2, "{completed}");
    // A template outside the patterns is refused before the server.
    let outside = one
        .request(
            "completion/complete",
            json!({
                "ref": {"type": "ref/resource", "uri": "file:///data/../{name}"},
                "argument": {"name": "name", "value": ""},
            }),
        )
        .await;
    assert_eq!(outside["error"]["code"], -32602, "{outside}");
    // A prompt's argument values name no prompt or resource: as given.
    let prompt = one
        .request(
            "completion/complete",
            json!({
                "ref": {"type": "ref/prompt", "name": "greet"},
                "argument": {"name": "who", "value": ""},
            }),
        )
        .await;
    assert_eq!(
        prompt["result"]["completion"]["values"],
        json!(["../anyone", "bob"]),
        "{prompt}"
    );
    let received = received(&stack);
    let completions = received
        .iter()
        .filter(|r| r["method"] == "completion/complete")
        .count();
    assert_eq!(completions, 2, "{received:#?}");
}
