//! Chat completions through a real worker process: a real registry, the
//! test MCP server as a stdio child, and a scripted OpenAI-compatible
//! upstream served over HTTP by the test, which records every request the
//! worker sent it.

use std::time::{Duration, Instant};

use quiver_testkit::upstream::{
    COMPLETION_TOKENS_PER_ITEM, PROMPT_TOKENS_PER_MESSAGE, Reply, Script, ScriptedToolCall,
};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sse_stream::SseStream;

use crate::stack::Stack;
use crate::worker::{CALLER, injected, stdio_record};

/// The test server's record id in these tests.
const TK: &str = "tk";

/// A stack with the test server as [`TK`] (its `allowed` tools enabled)
/// and `script` as the upstream, once the worker lists the server's tools.
async fn start(script: Script, allowed: &[&str]) -> Stack {
    Stack::builder()
        .record(stdio_record(TK, allowed))
        .upstream(script)
        .tools_listed(1)
        .start()
        .await
}

fn post(stack: &Stack, body: &Value) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", stack.worker.url()))
        .bearer_auth(CALLER)
        .json(body)
}

/// A non-streaming chat request: status and JSON body.
async fn chat(stack: &Stack, body: Value) -> (StatusCode, Value) {
    let response = post(stack, &body).send().await.expect("chat request");
    let status = response.status();
    let bytes = response.bytes().await.expect("chat body");
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// A streaming chat request: every `data:` payload, `[DONE]` included.
async fn chat_stream(stack: &Stack, body: Value) -> (StatusCode, Vec<String>) {
    let response = post(stack, &body).send().await.expect("chat request");
    let status = response.status();
    let mut events = SseStream::from_bytes_stream(response.bytes_stream());
    let mut data = Vec::new();
    while let Some(event) = futures::StreamExt::next(&mut events).await {
        if let Some(payload) = event.expect("sse event").data {
            data.push(payload);
        }
    }
    (status, data)
}

/// Tool calls the test server received (`stats` itself excluded).
async fn server_calls(stack: &Stack) -> u64 {
    server_stats(stack).await["calls"].as_u64().expect("calls")
}

/// The test server's counters, read through the worker's tool API.
async fn server_stats(stack: &Stack) -> Value {
    let text = stack
        .worker
        .call_text(&injected(TK, "stats"), json!({}))
        .await;
    serde_json::from_str(&text).expect("stats JSON")
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

fn mcp_on() -> Value {
    json!({"enabled": true, "server_ids": [TK]})
}

fn caller_tool(name: &str) -> Value {
    json!({"type": "function", "function": {
        "name": name,
        "description": "the caller's own tool",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }})
}

fn content(response: &Value) -> &Value {
    &response["choices"][0]["message"]["content"]
}

fn tool_messages(request: &Value) -> Vec<&Value> {
    request["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect()
}

fn error_code(tool_message: &Value) -> String {
    let content: Value =
        serde_json::from_str(tool_message["content"].as_str().expect("tool content"))
            .unwrap_or(Value::Null);
    content["error"]["code"].as_str().unwrap_or("").to_owned()
}

#[tokio::test]
async fn mcp_is_off_by_default_and_the_body_passes_unchanged() {
    let stack = start(
        Script::sequence([Reply::text("plain"), Reply::text("again")]),
        &["echo"],
    )
    .await;
    // Unusual fields and formatting must reach the upstream untouched.
    let raw = r#"{"model":"m-1","messages":[{"role":"user","content":"hi"}],"temperature":0.25,"tools":[{"type":"function","function":{"name":"mine","parameters":{"type":"object"}}}],"x_vendor":{"keep":[1,2,{"deep":true}]}}"#;
    let response = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", stack.worker.url()))
        .bearer_auth(CALLER)
        .header("content-type", "application/json")
        .body(raw)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().contains_key("x-request-id"));
    let answer: Value = response.json().await.unwrap();
    assert_eq!(content(&answer), "plain");
    assert!(
        answer.get("mcp").is_none(),
        "no extension without mcp: {answer}"
    );
    let sent = &stack.upstream().requests()[0];
    assert_eq!(
        sent.raw.as_ref(),
        raw.as_bytes(),
        "byte-for-byte pass-through"
    );
    assert!(
        sent.headers.get("authorization").is_none(),
        "the caller's token is never forwarded"
    );

    // `mcp` present but disabled: stripped, nothing injected, otherwise equal.
    let mut body: Value = serde_json::from_str(raw).unwrap();
    body["mcp"] = json!({"enabled": false, "server_ids": [TK]});
    let (status, _) = chat(&stack, body.clone()).await;
    assert_eq!(status, StatusCode::OK);
    let sent = &stack.upstream().requests()[1].body;
    body.as_object_mut().unwrap().remove("mcp");
    assert_eq!(sent, &body, "equivalent JSON, no mcp, no MCP tools");
}

#[tokio::test]
async fn allowed_tools_are_injected_after_the_callers_with_schemas_unchanged() {
    let stack = start(Script::sequence([Reply::text("ok")]), &["echo", "add"]).await;
    let listed = stack.worker.tools().await;
    let (status, answer) = chat(
        &stack,
        json!({
            "model": "m",
            "messages": [user("hi")],
            "tools": [caller_tool("get_weather")],
            "tool_choice": "auto",
            "mcp": mcp_on(),
        }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let sent = &stack.upstream().requests()[0].body;
    assert!(sent.get("mcp").is_none(), "extension stripped: {sent}");
    assert_eq!(sent["tool_choice"], "auto");
    let tools = sent["tools"].as_array().unwrap();
    assert_eq!(
        tools[0],
        caller_tool("get_weather"),
        "caller's tool first, unchanged"
    );
    let mut injected_names: Vec<&str> = tools[1..]
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    injected_names.sort();
    let mut expected = vec![injected(TK, "add"), injected(TK, "echo")];
    expected.sort();
    assert_eq!(injected_names, expected, "exactly the allowed tools");
    for tool in &tools[1..] {
        assert_eq!(tool["type"], "function");
        let name = &tool["function"]["name"];
        let listing = listed.iter().find(|t| &t["name"] == name).unwrap();
        assert_eq!(
            tool["function"]["parameters"], listing["input_schema"],
            "schema passed through unchanged"
        );
        assert_eq!(tool["function"]["description"], listing["description"]);
    }
    assert_eq!(answer["mcp"]["stop_reason"], "completed");
    assert_eq!(answer["mcp"]["iterations"], 1);
}

#[tokio::test]
async fn two_calls_in_one_turn_run_concurrently_and_answer_with_their_ids() {
    let sleep = injected(TK, "sleep");
    let stack = start(
        Script::sequence([
            Reply::tool_calls(vec![
                ScriptedToolCall::new("call_a", &sleep, json!({"ms": 400})),
                ScriptedToolCall::new("call_b", &sleep, json!({"ms": 400})),
            ]),
            Reply::text("both done"),
        ]),
        &["sleep", "stats"],
    )
    .await;
    let started = Instant::now();
    let response = post(
        &stack,
        &json!({"model": "m", "messages": [user("sleep twice")], "mcp": mcp_on()}),
    )
    .header("x-request-id", "req-e2e-audit")
    .header("x-quiver-session", "session-7")
    .send()
    .await
    .unwrap();
    let elapsed = started.elapsed();
    let status = response.status();
    assert_eq!(response.headers()["x-request-id"], "req-e2e-audit");
    let answer: Value = response.json().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(content(&answer), "both done");
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");

    let requests = stack.upstream().requests();
    assert_eq!(requests.len(), 2);
    let between = requests[1].received_at - requests[0].received_at;
    eprintln!("two 400 ms calls in one turn: {between:?} between upstream requests");
    assert!(
        between >= Duration::from_millis(400) && between < Duration::from_millis(750),
        "concurrent: {between:?}"
    );
    assert!(elapsed < Duration::from_millis(1500), "{elapsed:?}");
    assert_eq!(server_stats(&stack,).await["inflight_max"], 2);

    let second = &requests[1].body;
    let messages = second["messages"].as_array().unwrap();
    let assistant = &messages[1];
    assert_eq!(assistant["role"], "assistant");
    assert_eq!(assistant["tool_calls"][0]["id"], "call_a");
    let tools = tool_messages(second);
    assert_eq!(tools.len(), 2);
    assert_eq!(tools[0]["tool_call_id"], "call_a");
    assert_eq!(tools[1]["tool_call_id"], "call_b");
    assert_eq!(tools[0]["content"], "slept 400ms");

    let calls = answer["mcp"]["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2);
    for call in calls {
        assert_eq!(call["status"], "ok");
        assert_eq!(call["server_id"], TK);
        assert_eq!(call["tool"], "sleep");
        assert!(call["duration_ms"].as_f64().unwrap() >= 400.0, "{call}");
    }
    // Usage is summed over both upstream requests.
    let prompt = PROMPT_TOKENS_PER_MESSAGE * (1 + 4);
    let completion = COMPLETION_TOKENS_PER_ITEM * (2 + 1);
    assert_eq!(answer["usage"]["prompt_tokens"], prompt);
    assert_eq!(answer["usage"]["completion_tokens"], completion);
    assert_eq!(answer["usage"]["total_tokens"], prompt + completion);

    // One audit line per MCP call and one per chat request, with the ids.
    let audit: Vec<Value> = stack
        .worker
        .logged_lines("req-e2e-audit")
        .iter()
        .map(|line| serde_json::from_str(line).expect("JSON log line"))
        .collect();
    let calls: Vec<&Value> = audit
        .iter()
        .filter(|line| line["fields"]["message"] == "mcp tool call")
        .collect();
    assert_eq!(calls.len(), 2, "{audit:#?}");
    for line in calls {
        let fields = &line["fields"];
        assert_eq!(line["target"], "quiver::audit");
        assert_eq!(fields["session_id"], "session-7");
        assert_eq!(
            (&fields["server_id"], &fields["tool"]),
            (&json!(TK), &json!("sleep"))
        );
        assert_eq!(fields["status"], "ok");
        assert_eq!(fields["task"], "default");
        assert_eq!(fields["arguments"], "[\"ms\"]", "argument keys only");
    }
    assert!(
        audit
            .iter()
            .any(|line| line["fields"]["message"] == "chat request"
                && line["fields"]["status"] == 200),
        "{audit:#?}"
    );
}

/// A model that calls `echo` `per_turn` times in every turn, whatever it is told.
fn never_stops(per_turn: usize) -> Script {
    let echo = injected(TK, "echo");
    Script::respond(move |_, index| {
        Reply::tool_calls(
            (0..per_turn)
                .map(|i| {
                    ScriptedToolCall::new(format!("r{index}c{i}"), &echo, json!({"text": "again"}))
                })
                .collect(),
        )
    })
}

#[tokio::test]
async fn max_iterations_ends_a_model_that_never_stops() {
    let stack = start(never_stops(1), &["echo", "stats"]).await;
    let mut mcp = mcp_on();
    mcp["max_iterations"] = json!(3);
    let (status, answer) = chat(
        &stack,
        json!({"model": "m", "messages": [user("loop")], "mcp": mcp}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["mcp"]["stop_reason"], "max_iterations");
    // 3 turns ran their calls; the 4th request asked for an answer without tools.
    let requests = stack.upstream().requests();
    assert_eq!(requests.len(), 4);
    assert_eq!(requests[3].body["tool_choice"], "none");
    assert_eq!(server_calls(&stack,).await, 3);
    let message = &answer["choices"][0]["message"];
    assert!(
        message.get("tool_calls").is_none(),
        "MCP calls removed: {message}"
    );
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    let statuses: Vec<&str> = answer["mcp"]["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["ok", "ok", "ok", "deferred"]);
}

#[tokio::test]
async fn max_total_tool_calls_refuses_the_calls_beyond_it() {
    let stack = start(never_stops(3), &["echo", "stats"]).await;
    let mut mcp = mcp_on();
    mcp["max_total_tool_calls"] = json!(4);
    let (status, answer) = chat(
        &stack,
        json!({"model": "m", "messages": [user("loop")], "mcp": mcp}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["mcp"]["stop_reason"], "max_total_tool_calls");
    assert_eq!(server_calls(&stack,).await, 4);
    let requests = stack.upstream().requests();
    assert_eq!(requests.len(), 3);
    let third = &requests[2].body;
    assert_eq!(third["tool_choice"], "none");
    let codes: Vec<String> = tool_messages(third).into_iter().map(error_code).collect();
    // Turn 1: three calls run; turn 2: one runs, two are over budget.
    assert_eq!(
        codes,
        ["", "", "", "", "mcp_budget_exceeded", "mcp_budget_exceeded"]
    );
}

#[tokio::test]
async fn a_request_cannot_raise_its_budgets_or_servers() {
    let stack = start(Script::sequence([]), &["echo"]).await;
    let (status, answer) = chat(
        &stack,
        json!({"messages": [user("x")], "mcp": {"enabled": true, "max_iterations": 1000}}),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    assert_eq!(answer["error"]["code"], "mcp_policy_denied");
    assert_eq!(answer["error"]["field"], "mcp.max_iterations");
    let (status, answer) = chat(
        &stack,
        json!({"messages": [user("x")], "mcp": {"enabled": true, "server_idz": []}}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("server_idz")
    );
    assert_eq!(stack.upstream().request_count(), 0, "nothing sent upstream");
}

#[tokio::test]
async fn names_that_were_not_injected_never_run() {
    let echo = injected(TK, "echo");
    let stack = start(
        Script::sequence([
            Reply::tool_calls(vec![
                // `fail` exists on the server but is not in allowed_tools.
                ScriptedToolCall::new("c1", injected(TK, "fail"), json!({"message": "x"})),
                ScriptedToolCall::new("c2", "mcp__!!not-base64__??", json!({})),
                // `add` is allowed by the record but denied by this request.
                ScriptedToolCall::new("c3", injected(TK, "add"), json!({"a": 1, "b": 2})),
                ScriptedToolCall::new("c4", injected("other-server", "echo"), json!({"text": "x"})),
                ScriptedToolCall::raw("c5", &echo, "{not json"),
                ScriptedToolCall::new("c6", &echo, json!({"text": 7})),
            ]),
            Reply::text("done"),
        ]),
        &["echo", "add", "stats"],
    )
    .await;
    let before = server_calls(&stack).await;
    let mut mcp = mcp_on();
    mcp["tool_denylist"] = json!(["tk.add"]);
    let (status, answer) = chat(
        &stack,
        json!({"model": "m", "messages": [user("try")], "mcp": mcp}),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a failed tool call never fails the request: {answer}"
    );
    assert_eq!(content(&answer), "done");
    let second = &stack.upstream().requests()[1].body;
    let codes: Vec<String> = tool_messages(second).into_iter().map(error_code).collect();
    assert_eq!(
        codes,
        [
            "mcp_policy_denied",
            "mcp_policy_denied",
            "mcp_policy_denied",
            "mcp_policy_denied",
            "mcp_invalid_arguments",
            "mcp_invalid_arguments",
        ]
    );
    assert_eq!(
        server_calls(&stack,).await,
        before,
        "the MCP server saw none of these calls"
    );
}

#[tokio::test]
async fn tool_choice_passes_through_and_a_forced_function_must_be_known() {
    let echo = injected(TK, "echo");
    let stack = start(
        Script::sequence([
            Reply::text("none"),
            Reply::text("auto"),
            Reply::tool_call("f1", &echo, json!({"text": "forced"})),
            Reply::text("after forced"),
        ]),
        &["echo"],
    )
    .await;
    for choice in ["none", "auto"] {
        let (status, answer) = chat(
            &stack,
            json!({"messages": [user("x")], "tool_choice": choice, "mcp": mcp_on()}),
        )
        .await;
        assert_eq!((status, content(&answer)), (StatusCode::OK, &json!(choice)));
    }
    let forced = json!({"type": "function", "function": {"name": echo}});
    let (status, answer) = chat(
        &stack,
        json!({"messages": [user("x")], "tool_choice": forced, "mcp": mcp_on()}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let requests = stack.upstream().requests();
    assert_eq!(requests[0].body["tool_choice"], "none");
    assert_eq!(requests[1].body["tool_choice"], "auto");
    assert_eq!(
        requests[2].body["tool_choice"], forced,
        "forced choice passed through"
    );
    assert_eq!(
        requests[3].body["tool_choice"], "auto",
        "the follow-up is not forced again"
    );

    let unknown = json!({"type": "function", "function": {"name": injected(TK, "add")}});
    let (status, answer) = chat(
        &stack,
        json!({"messages": [user("x")], "tool_choice": unknown, "mcp": mcp_on()}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"]["field"], "tool_choice.function.name");
    assert_eq!(stack.upstream().request_count(), 4);
}

#[tokio::test]
async fn caller_tools_round_trip_and_a_mixed_turn_defers_the_mcp_calls() {
    let echo = injected(TK, "echo");
    let stack = start(
        Script::sequence([
            Reply::tool_call("w1", "get_weather", json!({"city": "Oslo"})),
            Reply::tool_calls(vec![
                ScriptedToolCall::new("w2", "get_weather", json!({"city": "Rome"})),
                ScriptedToolCall::new("e2", &echo, json!({"text": "mixed"})),
            ]),
        ]),
        &["echo", "stats"],
    )
    .await;
    let request = json!({
        "messages": [user("weather?")],
        "tools": [caller_tool("get_weather")],
        "mcp": mcp_on(),
    });
    let (status, answer) = chat(&stack, request.clone()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["choices"][0]["finish_reason"], "tool_calls");
    let call = &answer["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["id"], "w1");
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(
        call["function"]["arguments"],
        json!({"city": "Oslo"}).to_string()
    );
    assert_eq!(answer["mcp"]["stop_reason"], "caller_tools");

    let before = server_calls(&stack).await;
    let (status, answer) = chat(&stack, request).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let calls = answer["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap();
    assert_eq!(
        calls.len(),
        1,
        "only the caller's call is returned: {answer}"
    );
    assert_eq!(calls[0]["id"], "w2");
    assert_eq!(answer["choices"][0]["finish_reason"], "tool_calls");
    let deferred = &answer["mcp"]["calls"][0];
    assert_eq!(
        (&deferred["id"], &deferred["status"], &deferred["tool"]),
        (&json!("e2"), &json!("deferred"), &json!("echo"))
    );
    assert_eq!(
        server_calls(&stack,).await,
        before,
        "the MCP call was not run"
    );
}

#[tokio::test]
async fn streaming_runs_the_loop_and_streams_the_answer() {
    let echo = injected(TK, "echo");
    let stack = start(
        Script::sequence([
            Reply::tool_call("s1", &echo, json!({"text": "streamed tool"})),
            Reply::text("The tool said: streamed tool."),
            Reply::text("no tools here"),
        ]),
        &["echo"],
    )
    .await;
    let (status, events) = chat_stream(
        &stack,
        json!({
            "model": "m",
            "messages": [user("go")],
            "stream": true,
            "stream_options": {"include_usage": true},
            "mcp": mcp_on(),
        }),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk JSON"))
        .collect();
    let id = &chunks[0]["id"];
    let mut text = String::new();
    let mut finish = Vec::new();
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk", "{chunk}");
        assert_eq!(&chunk["id"], id, "one completion id");
        if let Some(choice) = chunk["choices"].get(0) {
            text.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
            assert!(
                choice["delta"].get("tool_calls").is_none(),
                "MCP calls not shown"
            );
            if !choice["finish_reason"].is_null() {
                finish.push(choice["finish_reason"].clone());
            }
        }
    }
    assert_eq!(text, "The tool said: streamed tool.");
    assert_eq!(finish, [json!("stop")]);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let with_mcp = chunks.iter().find(|c| c.get("mcp").is_some()).unwrap();
    assert_eq!(with_mcp["mcp"]["calls"][0]["status"], "ok");
    let usage = &chunks.last().unwrap()["usage"];
    assert!(usage["total_tokens"].as_u64().unwrap() > 0, "{usage}");
    let tool = tool_messages(&stack.upstream().requests()[1].body)[0].clone();
    assert_eq!(
        (&tool["tool_call_id"], &tool["content"]),
        (&json!("s1"), &json!("streamed tool"))
    );

    // Without mcp the stream is passed through as the upstream sent it.
    let (status, events) = chat_stream(
        &stack,
        json!({"model": "m", "messages": [user("go")], "stream": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let text: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(text, "no tools here");
}

#[tokio::test]
async fn upstream_rejections_pass_through_and_failures_are_retried() {
    let stack = start(
        Script::sequence([
            Reply::error(400, "bad temperature"),
            Reply::error(503, "overloaded"),
            Reply::text("recovered"),
            Reply::Error {
                status: 429,
                message: "slow down".into(),
                retry_after: Some(1),
            },
            Reply::text("after the pause"),
        ]),
        &["echo"],
    )
    .await;
    let (status, answer) = chat(&stack, json!({"messages": [user("x")], "mcp": mcp_on()})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        answer["error"]["message"], "bad temperature",
        "provider's message"
    );
    assert_eq!(stack.upstream().request_count(), 1, "400 is not retried");

    let (status, answer) = chat(&stack, json!({"messages": [user("x")], "mcp": mcp_on()})).await;
    assert_eq!(
        (status, content(&answer)),
        (StatusCode::OK, &json!("recovered"))
    );
    assert_eq!(stack.upstream().request_count(), 3, "503 retried once");

    let (status, answer) = chat(&stack, json!({"messages": [user("x")]})).await;
    assert_eq!(
        (status, content(&answer)),
        (StatusCode::OK, &json!("after the pause"))
    );
    let requests = stack.upstream().requests();
    let waited = requests[4].received_at - requests[3].received_at;
    assert!(
        waited >= Duration::from_millis(950),
        "Retry-After honoured: {waited:?}"
    );
}

#[tokio::test]
async fn chat_without_an_upstream_is_refused_clearly() {
    let stack = Stack::builder().start().await;
    let worker = &stack.worker;
    let response = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", worker.url()))
        .bearer_auth(CALLER)
        .json(&json!({"messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_not_configured");
    let response = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", worker.url()))
        .json(&json!({"messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
}
