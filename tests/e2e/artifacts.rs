//! Artifacts and vision (issue #14, docs/reference.md §13.2): images of tool
//! results go to the worker's artifact store, are listed by the tool API and
//! served at `GET /v1/artifacts/{id}` to their caller only; chat requests with
//! vision hand them to the model as an `image_url` part of a `role=user`
//! message, others name them in the tool message. server-everything's
//! `get-tiny-image` (the npm reference server, a real process) and
//! `tests/e2e/peers/images.py` (images of any size) are the servers; real
//! `quiver registry` and `quiver worker`, the scripted upstream over HTTP.

use std::path::Path;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use quiver_testkit::upstream::{Reply, Script};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{CALLER, everything_record, injected, metrics_text};
use crate::openai_sdk::sdk_python;
use crate::stack::{Stack, StackBuilder};

/// A second caller token (task `plain`, without vision by default).
const OTHER: &str = "e2e-other-caller-token";

/// A stack with `record`, and a worker with `config` as its config file
/// (plus a `plain` task for [`OTHER`]).
fn builder(record: Value, config: &str) -> StackBuilder {
    Stack::builder().record(record).worker_config(&format!(
        "{config}\n[[callers]]\ntoken = \"{OTHER}\"\ntask = \"plain\"\n\n[tasks.plain]\n"
    ))
}

async fn call(stack: &Stack, token: &str, name: &str, arguments: Value) -> (StatusCode, Value) {
    let response = reqwest::Client::new()
        .post(format!("{}/v1/mcp/tools/call", stack.worker.url()))
        .bearer_auth(token)
        .json(&json!({"name": name, "arguments": arguments}))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .expect("POST /v1/mcp/tools/call");
    let status = response.status();
    (status, response.json().await.expect("JSON answer"))
}

/// `GET url` with `token`: status, content type, body.
async fn fetch(stack: &Stack, url: &str, token: Option<&str>) -> (StatusCode, String, Vec<u8>) {
    let mut request = reqwest::Client::new().get(format!("{}{url}", stack.worker.url()));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("GET artifact");
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response.bytes().await.expect("body").to_vec();
    (status, content_type, body)
}

async fn chat(stack: &Stack, token: &str, mcp: Value) -> Value {
    let response = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", stack.worker.url()))
        .bearer_auth(token)
        .json(&json!({
            "model": "m",
            "messages": [{"role": "user", "content": "Show me the logo"}],
            "mcp": mcp,
        }))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .expect("chat");
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.expect("chat JSON")
}

async fn metric(stack: &Stack, name: &str) -> Option<f64> {
    let text = metrics_text(&format!("{}/metrics", stack.worker.url())).await;
    text.lines()
        .filter(|line| line.starts_with(name))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .reduce(|a, b| a + b)
}

/// The text items of a tool API answer.
fn texts(body: &Value) -> Vec<&str> {
    body["content"]
        .as_array()
        .expect("content")
        .iter()
        .filter_map(|item| item["text"].as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_tiny_image_is_an_artifact_served_to_its_caller_only() {
    let stack = builder(everything_record("everything", &["*"]), "")
        .start()
        .await;
    let (status, body) = call(
        &stack,
        CALLER,
        &injected("everything", "get-tiny-image"),
        json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["is_error"], false, "{body}");
    let artifacts = body["artifacts"].as_array().expect("artifacts listed");
    assert_eq!(artifacts.len(), 1, "{body}");
    let artifact = &artifacts[0];
    let id = artifact["id"].as_str().expect("id");
    assert_eq!(id.len(), 64, "a SHA-256 in hex: {id}");
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    let url = artifact["url"].as_str().expect("url");
    assert_eq!(url, format!("/v1/artifacts/{id}"));
    assert_eq!(artifact["mime_type"], "image/png");
    let bytes = artifact["bytes"].as_u64().expect("bytes");
    // No base64 left in the answer; the text says an artifact was produced.
    assert!(
        body["content"]
            .as_array()
            .expect("content")
            .iter()
            .all(|item| item["type"] == "text"),
        "{body}"
    );
    let texts = texts(&body);
    assert!(
        texts
            .iter()
            .any(|t| t.contains("Here's the image you requested")),
        "{texts:?}"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.contains(id) && t.contains("image/png") && t.contains(&bytes.to_string())),
        "{texts:?}"
    );

    // Its caller gets the PNG.
    let (status, content_type, png) = fetch(&stack, url, Some(CALLER)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type, "image/png");
    assert_eq!(png.len() as u64, bytes);
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    // Another caller token: not found; no token: unauthenticated.
    let (status, _, body) = fetch(&stack, url, Some(OTHER)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let body: Value = serde_json::from_slice(&body).expect("error JSON");
    assert_eq!(body["error"]["code"], "not_found", "{body}");
    let (status, _, body) = fetch(&stack, url, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let body: Value = serde_json::from_slice(&body).expect("error JSON");
    assert_eq!(body["error"]["code"], "unauthenticated", "{body}");
    let (status, _, _) = fetch(&stack, url, Some("not-a-caller")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // A forged signature is no credential.
    let (status, _, _) = fetch(&stack, &format!("{url}?caller=0&sig=00"), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // The other caller's own call of the same image is its own artifact.
    let (status, body) = call(
        &stack,
        OTHER,
        &injected("everything", "get-tiny-image"),
        json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["artifacts"][0]["id"], id, "content-addressed");
    let (status, _, other) = fetch(&stack, url, Some(OTHER)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(other, png);

    assert!(metric(&stack, "quiver_artifacts_stored_total").await >= Some(2.0));
    assert_eq!(
        metric(&stack, "quiver_artifacts_bytes").await,
        Some(2.0 * bytes as f64)
    );
}

/// The messages of a recorded upstream request.
fn messages(body: &Value) -> &Vec<Value> {
    body["messages"].as_array().expect("messages")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vision_requests_carry_the_image_and_others_a_note() {
    let tiny = injected("everything", "get-tiny-image");
    // Task `default` (CALLER) shows images by default; task `plain` (OTHER)
    // only when the request asks.
    let stack = builder(
        everything_record("everything", &["get-tiny-image"]),
        "[tasks.default]\nvision = true\n",
    )
    .upstream(Script::sequence([
        Reply::tool_call("c1", &tiny, json!({})),
        Reply::text("the MCP logo"),
        Reply::tool_call("c2", &tiny, json!({})),
        Reply::text("an image was produced"),
        Reply::tool_call("c3", &tiny, json!({})),
        Reply::text("the MCP logo again"),
    ]))
    .start()
    .await;

    // 1. `mcp.vision: true` in the request.
    let body = chat(&stack, OTHER, json!({"enabled": true, "vision": true})).await;
    assert_eq!(body["mcp"]["stop_reason"], "completed", "{body}");
    assert_eq!(body["mcp"]["calls"][0]["status"], "ok", "{body}");
    // 2. No vision: a text note only.
    let body = chat(&stack, OTHER, json!({"enabled": true})).await;
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "an image was produced"
    );
    // 3. The task's default.
    let body = chat(&stack, CALLER, json!({"enabled": true})).await;
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "the MCP logo again"
    );

    let requests = stack.upstream().requests();
    assert_eq!(requests.len(), 6);
    for (follow_up, call_id, vision) in [(1, "c1", true), (3, "c2", false), (5, "c3", true)] {
        let messages = messages(&requests[follow_up].body);
        let at = messages
            .iter()
            .position(|m| m["role"] == "tool" && m["tool_call_id"] == call_id)
            .unwrap_or_else(|| panic!("tool message of {call_id}: {messages:?}"));
        let note = messages[at]["content"].as_str().expect("tool text");
        assert!(
            note.contains("artifact") && note.contains("image/png"),
            "{note}"
        );
        assert!(!note.contains("iVBORw0KGgo"), "no base64 in the tool text");
        let next = messages.get(at + 1);
        if !vision {
            assert!(next.is_none(), "no image message: {next:?}");
            continue;
        }
        let next = next.expect("a user message with the image");
        assert_eq!(next["role"], "user", "{next}");
        let parts = next["content"].as_array().expect("content parts");
        assert_eq!(
            parts[0],
            json!({"type": "text", "text": format!("image from tool call {call_id}")})
        );
        assert_eq!(parts[1]["type"], "image_url", "{next}");
        let url = parts[1]["image_url"]["url"].as_str().expect("url");
        let data = url
            .strip_prefix("data:image/png;base64,")
            .unwrap_or_else(|| panic!("a data: URL: {url}"));
        let png = BASE64.decode(data).expect("base64");
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
        // The same bytes as the artifact the caller can fetch.
        let id = note
            .split_whitespace()
            .find(|word| word.len() == 64 && word.bytes().all(|b| b.is_ascii_hexdigit()))
            .expect("the artifact id in the note");
        let token = if call_id == "c1" { OTHER } else { CALLER };
        let (status, _, fetched) = fetch(&stack, &format!("/v1/artifacts/{id}"), Some(token)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(fetched, png);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vision_with_artifact_urls_hands_the_model_a_signed_url() {
    let tiny = injected("everything", "get-tiny-image");
    let stack = builder(
        everything_record("everything", &["get-tiny-image"]),
        "[artifacts]\nvision_url = \"artifact\"\n",
    )
    .upstream(Script::sequence([
        Reply::tool_call("c1", &tiny, json!({})),
        Reply::text("the MCP logo"),
    ]))
    .start()
    .await;
    chat(&stack, CALLER, json!({"enabled": true, "vision": true})).await;
    let requests = stack.upstream().requests();
    let messages = messages(&requests[1].body);
    let image = messages.last().expect("the image message");
    assert_eq!(image["role"], "user", "{image}");
    let url = image["content"][1]["image_url"]["url"]
        .as_str()
        .expect("url");
    // The listener's own address (no public_url configured), signed.
    let path = url
        .strip_prefix(&stack.worker.url())
        .unwrap_or_else(|| panic!("an absolute URL on the worker: {url}"));
    assert!(
        path.starts_with("/v1/artifacts/") && path.contains("&sig="),
        "{path}"
    );
    // The provider has no caller token: the signature is the credential.
    let (status, content_type, png) = fetch(&stack, path, None).await;
    assert_eq!(
        (status, content_type.as_str()),
        (StatusCode::OK, "image/png")
    );
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    let (status, _, _) = fetch(&stack, &format!("{path}00"), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

/// The record of `tests/e2e/peers/images.py`.
fn images_record() -> Value {
    let peer = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/e2e/peers/images.py");
    json!({
        "server_id": "images",
        "transport": "stdio",
        "stdio": {"command": sdk_python(), "args": [peer.display().to_string()]},
        "allowed_tools": ["image"],
        // Far below the images: binary content does not count against it.
        "budgets": {"max_tool_output_bytes": 100, "tool_timeout_ms": 20_000},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_store_drops_the_oldest_and_calls_never_fail() {
    let stack = builder(
        images_record(),
        "[artifacts]\nmax_total_bytes = 3000\nmax_caller_bytes = 3000\nmax_item_bytes = 1500\n",
    )
    .start()
    .await;
    let image = injected("images", "image");
    let mut urls = Vec::new();
    for seed in 1..=4 {
        let (status, body) =
            call(&stack, CALLER, &image, json!({"seed": seed, "size": 1000})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(body.get("truncated").is_none(), "{body}");
        assert_eq!(body["artifacts"][0]["bytes"], 1000, "{body}");
        urls.push(
            body["artifacts"][0]["url"]
                .as_str()
                .expect("url")
                .to_owned(),
        );
    }
    // Three fit: the first went when the fourth came.
    let (status, _, _) = fetch(&stack, &urls[0], Some(CALLER)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    for url in &urls[1..] {
        let (status, content_type, bytes) = fetch(&stack, url, Some(CALLER)).await;
        assert_eq!(
            (status, content_type.as_str()),
            (StatusCode::OK, "image/png")
        );
        assert_eq!(bytes.len(), 1000);
    }
    // Over the item limit: still a result, with a note naming the limit.
    let (status, body) = call(&stack, CALLER, &image, json!({"seed": 9, "size": 2000})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["is_error"], false, "{body}");
    assert!(body.get("artifacts").is_none(), "{body}");
    let texts = texts(&body);
    assert!(
        texts
            .iter()
            .any(|t| t.contains("max_item_bytes") && t.contains("1500")),
        "{texts:?}"
    );
    // Nothing was evicted for it.
    for url in &urls[1..] {
        let (status, _, _) = fetch(&stack, url, Some(CALLER)).await;
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(metric(&stack, "quiver_artifacts_bytes").await, Some(3000.0));
    assert_eq!(
        metric(&stack, "quiver_artifacts_evicted_total").await,
        Some(1.0)
    );
}

/// `GET url` with `token`: status, headers.
async fn headers_of(
    stack: &Stack,
    url: &str,
    token: &str,
) -> (StatusCode, reqwest::header::HeaderMap) {
    let response = reqwest::Client::new()
        .get(format!("{}{url}", stack.worker.url()))
        .bearer_auth(token)
        .send()
        .await
        .expect("GET artifact");
    (response.status(), response.headers().clone())
}

fn header<'a>(headers: &'a reqwest::header::HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_content_is_an_attachment_and_an_id_keeps_its_type() {
    let stack = builder(images_record(), "").start().await;
    let image = injected("images", "image");
    let store = async |mime: &str, text: &str| {
        let (status, body) = call(
            &stack,
            CALLER,
            &image,
            json!({"seed": 1, "size": 1, "mime": mime, "text": text}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["artifacts"][0]["mime_type"], mime, "{body}");
        body["artifacts"][0]["url"]
            .as_str()
            .expect("url")
            .to_owned()
    };
    let page = "<html><script>fetch('/v1/mcp/tools')</script></html>";
    // The same bytes as PNG, then as HTML: two artifacts, each its type.
    let png = store("image/png", page).await;
    let html = store("text/html", page).await;
    let svg = store(
        "image/svg+xml",
        "<svg xmlns='http://www.w3.org/2000/svg' onload='alert(1)'/>",
    )
    .await;
    let xhtml = store("application/xhtml+xml; charset=utf-8", page).await;
    assert_ne!(png, html, "an id names one type");

    let (status, headers) = headers_of(&stack, &png, CALLER).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header(&headers, "content-type"), "image/png");
    assert_eq!(header(&headers, "content-disposition"), "inline");
    assert_eq!(header(&headers, "content-security-policy"), "sandbox");
    assert_eq!(header(&headers, "x-content-type-options"), "nosniff");
    for (url, declared) in [
        (&html, "text/html"),
        (&svg, "image/svg+xml"),
        (&xhtml, "application/xhtml+xml"),
    ] {
        let (status, headers) = headers_of(&stack, url, CALLER).await;
        assert_eq!(status, StatusCode::OK, "{declared}");
        assert_eq!(header(&headers, "content-type"), declared);
        assert!(
            header(&headers, "content-disposition").starts_with("attachment"),
            "{declared}: {headers:?}"
        );
        assert_eq!(header(&headers, "content-security-policy"), "sandbox");
        assert_eq!(header(&headers, "x-content-type-options"), "nosniff");
    }
    // The PNG's URL still serves a PNG after the HTML was stored.
    let (_, headers) = headers_of(&stack, &png, CALLER).await;
    assert_eq!(header(&headers, "content-type"), "image/png");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_over_its_share_evicts_only_its_own_artifacts() {
    let stack = builder(
        images_record(),
        "[artifacts]\nmax_total_bytes = 4000\nmax_caller_bytes = 2000\nmax_item_bytes = 1000\n",
    )
    .start()
    .await;
    let image = injected("images", "image");
    let store = async |token: &str, seed: u32| {
        let (status, body) = call(&stack, token, &image, json!({"seed": seed, "size": 1000})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body["artifacts"][0]["url"]
            .as_str()
            .expect("url")
            .to_owned()
    };
    let mut others = Vec::new();
    for seed in 1..=2 {
        others.push(store(OTHER, seed).await);
    }
    // The first caller stores far more than its share.
    let mut mine = Vec::new();
    for seed in 10..=19 {
        mine.push(store(CALLER, seed).await);
    }
    for url in &others {
        let (status, _, _) = fetch(&stack, url, Some(OTHER)).await;
        assert_eq!(status, StatusCode::OK, "the other caller's {url}");
    }
    for (at, url) in mine.iter().enumerate() {
        let (status, _, _) = fetch(&stack, url, Some(CALLER)).await;
        let expected = if at >= 8 {
            StatusCode::OK
        } else {
            StatusCode::NOT_FOUND
        };
        assert_eq!(status, expected, "own artifact #{at}");
    }
    assert_eq!(metric(&stack, "quiver_artifacts_bytes").await, Some(4000.0));
    assert_eq!(
        metric(&stack, "quiver_artifacts_evicted_total").await,
        Some(8.0)
    );
}
