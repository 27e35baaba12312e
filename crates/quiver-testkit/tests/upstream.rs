//! The scripted OpenAI-compatible upstream, driven over real HTTP by reqwest.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt as _;
use quiver_testkit::upstream::{
    EXHAUSTED_MESSAGE, Reply, Script, ScriptedToolCall, ScriptedUpstream, UpstreamOptions,
};
use serde_json::{Value, json};
use sse_stream::SseStream;

/// Upper bound for anything that should be quick; generous because the CI
/// machine is small and shared.
const WAIT: Duration = Duration::from_secs(20);

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(WAIT)
        .build()
        .expect("reqwest client")
}

fn chat_request(model: Option<&str>, messages: &[&str], stream: bool) -> Value {
    let messages: Vec<Value> = messages
        .iter()
        .map(|text| json!({"role": "user", "content": text}))
        .collect();
    let mut body = json!({"messages": messages, "stream": stream});
    if let Some(model) = model {
        body["model"] = json!(model);
    }
    body
}

async fn post(upstream: &ScriptedUpstream, body: &Value) -> reqwest::Response {
    client()
        .post(upstream.chat_completions_url())
        .json(body)
        .send()
        .await
        .expect("request to the scripted upstream")
}

/// The answer's JSON body, with `created` checked and removed.
async fn json_body(response: reqwest::Response) -> Value {
    let mut body: Value = response.json().await.expect("JSON answer");
    if let Some(created) = body.get("created") {
        assert_created(created);
        body["created"] = Value::Null;
    }
    body
}

fn assert_created(created: &Value) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    let created = created.as_u64().expect("created is a number");
    assert!(now.abs_diff(created) < 60, "created {created}, now {now}");
}

fn error_body(message: &str, kind: &str, status: u16) -> Value {
    json!({"error": {
        "message": message,
        "type": kind,
        "param": null,
        "code": status.to_string(),
    }})
}

#[tokio::test]
async fn sequence_answers_with_exact_shapes_and_records_requests() {
    let upstream = ScriptedUpstream::start(Script::sequence([
        Reply::text("hello there"),
        Reply::ToolCalls {
            content: Some("let me look".to_owned()),
            calls: vec![
                ScriptedToolCall::new("call_1", "get_weather", json!({"city": "Paris"})),
                ScriptedToolCall::raw("call_2", "broken", "{not json"),
            ],
        },
        Reply::tool_call("call_3", "echo", json!({"text": "x"})),
        Reply::Error {
            status: 429,
            message: "slow down".to_owned(),
            retry_after: Some(7),
        },
        Reply::error(503, "overloaded"),
        Reply::error(42, "not a status"),
    ]))
    .await;
    assert_eq!(
        upstream.base_url(),
        format!("http://127.0.0.1:{}/v1", upstream.addr().port())
    );

    let first = chat_request(Some("gpt-test"), &["hi", "there"], false);
    let response = client()
        .post(upstream.chat_completions_url())
        .bearer_auth("sk-test")
        .header("x-trace", "abc")
        .json(&first)
        .send()
        .await
        .expect("first request");
    assert_eq!(response.status(), 200);
    assert_eq!(
        json_body(response).await,
        json!({
            "id": "chatcmpl-scripted-0",
            "object": "chat.completion",
            "created": null,
            "model": "gpt-test",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": "hello there"},
                "finish_reason": "stop",
            }],
            "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25},
        })
    );

    // The unversioned path answers too, and a missing model is "scripted".
    let second = chat_request(None, &["a", "b", "c"], false);
    let response = client()
        .post(format!("http://{}/chat/completions", upstream.addr()))
        .json(&second)
        .send()
        .await
        .expect("second request");
    assert_eq!(response.status(), 200);
    assert_eq!(
        json_body(response).await,
        json!({
            "id": "chatcmpl-scripted-1",
            "object": "chat.completion",
            "created": null,
            "model": "scripted",
            "choices": [{
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "let me look",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                        },
                        {
                            "id": "call_2",
                            "type": "function",
                            "function": {"name": "broken", "arguments": "{not json"},
                        },
                    ],
                },
                "finish_reason": "tool_calls",
            }],
            "usage": {"prompt_tokens": 30, "completion_tokens": 10, "total_tokens": 40},
        })
    );

    let response = post(&upstream, &json!({"model": "m"})).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        json_body(response).await["choices"][0],
        json!({
            "index": 0,
            "message": {
                "role": "assistant",
                "content": null,
                "tool_calls": [{
                    "id": "call_3",
                    "type": "function",
                    "function": {"name": "echo", "arguments": "{\"text\":\"x\"}"},
                }],
            },
            "finish_reason": "tool_calls",
        })
    );

    let response = post(&upstream, &first).await;
    assert_eq!(response.status(), 429);
    assert_eq!(
        response.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"7"[..])
    );
    assert_eq!(
        json_body(response).await,
        error_body("slow down", "rate_limit_error", 429)
    );

    let response = post(&upstream, &first).await;
    assert_eq!(response.status(), 503);
    assert!(response.headers().get("retry-after").is_none());
    assert_eq!(
        json_body(response).await,
        error_body("overloaded", "server_error", 503)
    );

    let response = post(&upstream, &first).await;
    assert_eq!(response.status(), 500);
    assert_eq!(
        json_body(response).await,
        error_body(
            "scripted upstream: invalid scripted status 42: not a status",
            "server_error",
            500
        )
    );

    for _ in 0..2 {
        let response = post(&upstream, &first).await;
        assert_eq!(response.status(), 500);
        assert_eq!(
            json_body(response).await,
            error_body(EXHAUSTED_MESSAGE, "server_error", 500)
        );
    }

    assert_eq!(upstream.request_count(), 8);
    let requests = upstream.requests();
    assert_eq!(requests.len(), 8);
    assert_eq!(requests[0].body, first);
    assert_eq!(
        serde_json::from_slice::<Value>(&requests[0].raw).expect("raw body is JSON"),
        first
    );
    assert_eq!(requests[0].headers["authorization"], "Bearer sk-test");
    assert_eq!(requests[0].headers["x-trace"], "abc");
    assert_eq!(requests[0].headers["content-type"], "application/json");
    assert_eq!(requests[1].body, second);
    assert!(requests[1].headers.get("authorization").is_none());
    assert_eq!(requests[2].body, json!({"model": "m"}));
    assert!(
        requests
            .windows(2)
            .all(|pair| pair[0].received_at <= pair[1].received_at)
    );

    upstream.shutdown().await;
}

/// The chunks of a streamed answer as JSON, after checking that the stream
/// ends with `[DONE]`.
async fn stream_events(response: reqwest::Response) -> Vec<Value> {
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let events: Vec<_> = SseStream::from_bytes_stream(response.bytes_stream())
        .collect()
        .await;
    let mut data: Vec<String> = events
        .into_iter()
        .map(|event| {
            event
                .expect("well-formed SSE")
                .data
                .expect("every event has data")
        })
        .collect();
    assert_eq!(data.pop().as_deref(), Some("[DONE]"));
    data.iter()
        .map(|data| serde_json::from_str(data).expect("chunk is JSON"))
        .collect()
}

fn deltas(chunks: &[Value]) -> Vec<&Value> {
    chunks
        .iter()
        .filter_map(|chunk| chunk["choices"].get(0))
        .map(|choice| &choice["delta"])
        .collect()
}

#[tokio::test]
async fn streams_text_and_tool_calls_in_pieces() {
    let text = "héllo wörld — streamed in pieces ✓";
    let calls = vec![
        ScriptedToolCall::new("call_a", "get_weather", json!({"city": "Zürich"})),
        ScriptedToolCall::raw("call_b", "broken", "{\"unterminated"),
    ];
    let upstream = ScriptedUpstream::start(Script::sequence([
        Reply::text(text),
        Reply::ToolCalls {
            content: None,
            calls: calls.clone(),
        },
    ]))
    .await;

    let chunks =
        stream_events(post(&upstream, &chat_request(Some("gpt-s"), &["hi"], true)).await).await;
    for chunk in &chunks {
        assert_eq!(chunk["id"], "chatcmpl-scripted-0");
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], "gpt-s");
        assert_created(&chunk["created"]);
        assert!(chunk.get("usage").is_none(), "{chunk}");
    }
    assert_eq!(
        chunks[0]["choices"],
        json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}])
    );
    let last = chunks.last().expect("chunks");
    assert_eq!(
        last["choices"],
        json!([{"index": 0, "delta": {}, "finish_reason": "stop"}])
    );
    let pieces: Vec<&str> = deltas(&chunks[1..chunks.len() - 1])
        .iter()
        .map(|delta| delta["content"].as_str().expect("content delta"))
        .collect();
    assert!(pieces.len() >= 3, "{pieces:?}");
    assert_eq!(pieces.concat(), text);
    for chunk in &chunks[..chunks.len() - 1] {
        assert_eq!(chunk["choices"][0]["finish_reason"], Value::Null);
    }

    let mut request = chat_request(None, &["a", "b"], true);
    request["stream_options"] = json!({"include_usage": true});
    let chunks = stream_events(post(&upstream, &request).await).await;
    let (usage, chunks) = chunks.split_last().expect("chunks");
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(
        usage["usage"],
        json!({"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30})
    );
    for chunk in chunks {
        assert_eq!(chunk["id"], "chatcmpl-scripted-1");
        assert_eq!(chunk["model"], "scripted");
        assert_eq!(chunk["usage"], Value::Null, "{chunk}");
    }
    let (finish, chunks) = chunks.split_last().expect("chunks");
    assert_eq!(
        finish["choices"],
        json!([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}])
    );
    let deltas = deltas(&chunks[1..]);
    assert!(deltas.iter().all(|delta| delta.get("content").is_none()));
    for (index, call) in calls.iter().enumerate() {
        let parts: Vec<&Value> = deltas
            .iter()
            .map(|delta| &delta["tool_calls"][0])
            .filter(|part| part["index"] == index)
            .collect();
        assert_eq!(
            *parts[0],
            json!({
                "index": index,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            })
        );
        let pieces: Vec<&str> = parts[1..]
            .iter()
            .map(|part| {
                assert!(part.get("id").is_none() && part["function"].get("name").is_none());
                part["function"]["arguments"]
                    .as_str()
                    .expect("arguments delta")
            })
            .collect();
        assert!(pieces.len() >= 2, "{pieces:?}");
        assert_eq!(pieces.concat(), call.arguments);
    }
    assert!(
        deltas
            .iter()
            .all(|delta| delta["tool_calls"].as_array().map(Vec::len) == Some(1))
    );

    upstream.shutdown().await;
}

#[tokio::test]
async fn chunk_delay_spreads_the_stream_over_time() {
    let delay = Duration::from_millis(40);
    let upstream = ScriptedUpstream::start_with(
        Script::sequence([Reply::text("one two three four")]),
        UpstreamOptions::new().with_chunk_delay(Some(delay)),
    )
    .await;
    let response = post(&upstream, &chat_request(None, &["hi"], true)).await;
    let mut body = response.bytes_stream();
    let mut arrivals = Vec::new();
    let mut text = Vec::new();
    while let Some(bytes) = body.next().await {
        arrivals.push(Instant::now());
        text.extend_from_slice(&bytes.expect("stream body"));
    }
    // Role, three pieces, finish and [DONE]: five pauses between them.
    let events = text.windows(2).filter(|pair| pair == b"\n\n").count();
    assert_eq!(events, 6, "{}", String::from_utf8_lossy(&text));
    let spread = *arrivals.last().expect("some body") - arrivals[0];
    assert!(spread >= delay * 4, "stream arrived within {spread:?}");
    upstream.shutdown().await;
}

#[tokio::test]
async fn disconnect_fails_the_request_and_delay_waits() {
    let upstream = ScriptedUpstream::start(Script::sequence([
        Reply::Disconnect,
        Reply::text("late").delayed(Duration::from_millis(300)),
        Reply::Disconnect,
        Reply::text("fine"),
    ]))
    .await;
    let client = client();
    let send = |body: Value| {
        client
            .post(upstream.chat_completions_url())
            .json(&body)
            .send()
    };

    let failed = send(chat_request(None, &["x"], false)).await;
    assert!(failed.is_err(), "{failed:?}");

    let started = Instant::now();
    let late = send(chat_request(None, &["x"], false))
        .await
        .expect("delayed answer");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(
        json_body(late).await["choices"][0]["message"]["content"],
        "late"
    );

    let failed = send(chat_request(None, &["x"], true)).await;
    assert!(failed.is_err(), "{failed:?}");

    let fine = send(chat_request(None, &["x"], false))
        .await
        .expect("answer after a disconnect");
    assert_eq!(
        json_body(fine).await["choices"][0]["message"]["content"],
        "fine"
    );
    assert_eq!(upstream.request_count(), 4);
    upstream.shutdown().await;
}

#[tokio::test]
async fn errors_apply_to_streaming_requests() {
    let upstream = ScriptedUpstream::start(Script::sequence([Reply::Error {
        status: 429,
        message: "later".to_owned(),
        retry_after: Some(2),
    }]))
    .await;
    let response = post(&upstream, &chat_request(None, &["x"], true)).await;
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "2");
    assert_eq!(response.headers()["content-type"], "application/json");
    assert_eq!(
        json_body(response).await,
        error_body("later", "rate_limit_error", 429)
    );
    upstream.shutdown().await;
}

#[tokio::test]
async fn respond_sees_the_request_index_and_body() {
    let upstream = ScriptedUpstream::start(Script::respond(|request, index| {
        let said = request.body["messages"][0]["content"]
            .as_str()
            .unwrap_or("?");
        match index {
            2 => Reply::error(400, format!("no more than two, got {said}")),
            _ => Reply::text(format!("{index}: {said}")),
        }
    }))
    .await;
    for (index, word) in ["zero", "one"].into_iter().enumerate() {
        let response = post(&upstream, &chat_request(None, &[word], false)).await;
        let body = json_body(response).await;
        assert_eq!(
            body["choices"][0]["message"]["content"],
            format!("{index}: {word}")
        );
        assert_eq!(body["id"], format!("chatcmpl-scripted-{index}"));
    }
    let response = post(&upstream, &chat_request(None, &["two"], false)).await;
    assert_eq!(response.status(), 400);
    assert_eq!(
        json_body(response).await,
        error_body("no more than two, got two", "invalid_request_error", 400)
    );
    upstream.shutdown().await;
}

#[tokio::test]
async fn non_json_bodies_are_recorded_and_rejected() {
    let upstream =
        ScriptedUpstream::start(Script::sequence([Reply::text("zero"), Reply::text("one")])).await;
    let response = client()
        .post(upstream.chat_completions_url())
        .header("content-type", "text/plain")
        .body("not json")
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 400);
    let body = json_body(response).await;
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"]["code"], "400");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(message.contains("not a JSON chat request"), "{message}");

    // The rejected request still took index 0 of the script.
    let response = post(&upstream, &chat_request(None, &["x"], false)).await;
    assert_eq!(
        json_body(response).await["choices"][0]["message"]["content"],
        "one"
    );

    let requests = upstream.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].body, Value::Null);
    assert_eq!(&requests[0].raw[..], b"not json");
    assert_eq!(requests[0].headers["content-type"], "text/plain");
    upstream.shutdown().await;
}

#[tokio::test]
async fn without_recorded_bodies_answers_still_follow_the_request() {
    let upstream = ScriptedUpstream::start_with(
        Script::sequence([Reply::text("fast"), Reply::text("streamed")]),
        UpstreamOptions::new().with_record_bodies(false),
    )
    .await;
    let response = post(&upstream, &chat_request(Some("bench"), &["a", "b"], false)).await;
    let body = json_body(response).await;
    assert_eq!(body["model"], "bench");
    assert_eq!(body["usage"]["prompt_tokens"], 20);

    let mut request = chat_request(None, &["a"], true);
    request["stream_options"] = json!({"include_usage": true});
    let chunks = stream_events(post(&upstream, &request).await).await;
    assert_eq!(chunks.last().expect("chunks")["usage"]["prompt_tokens"], 10);

    let requests = upstream.requests();
    assert_eq!(requests.len(), 2);
    for request in &requests {
        assert!(request.raw.is_empty());
        assert_eq!(request.body, Value::Null);
        assert_eq!(request.headers["content-type"], "application/json");
    }
    assert_eq!(UpstreamOptions::default(), UpstreamOptions::new());
    assert!(UpstreamOptions::default().record_bodies);
    upstream.shutdown().await;
}

#[tokio::test]
async fn shutdown_cuts_pending_delays_short() {
    let upstream = ScriptedUpstream::start(Script::sequence([
        Reply::text("never").delayed(Duration::from_secs(600))
    ]))
    .await;
    let url = upstream.chat_completions_url();
    let pending = tokio::spawn(async move {
        client()
            .post(url)
            .json(&chat_request(None, &["x"], false))
            .send()
            .await
    });
    let deadline = Instant::now() + WAIT;
    while upstream.request_count() == 0 {
        assert!(Instant::now() < deadline, "request never arrived");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::timeout(WAIT, upstream.shutdown())
        .await
        .expect("shutdown waited for the delay");
    let answer = pending.await.expect("request task");
    assert!(answer.is_err(), "{answer:?}");
}
