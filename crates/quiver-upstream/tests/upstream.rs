//! The upstream client against real HTTP servers: the scripted
//! OpenAI-compatible upstream of `quiver-testkit`, and, for answers it cannot
//! give (a 200 that is not a chat completion, a body that stalls, events
//! after `[DONE]`, `retry-after-ms`), a small hand-written HTTP/1.1 server on
//! a real socket.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt as _;
use quiver_testkit::upstream::{Reply, Script, ScriptedUpstream, UpstreamOptions as ServerOptions};
use quiver_upstream::{Upstream, UpstreamConfigError, UpstreamError, UpstreamOptions};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use url::Url;

/// Upper bound for a call that should end on its own; a client that hangs
/// fails the test instead of the whole run.
const WAIT: Duration = Duration::from_secs(10);

/// Small backoffs and a generous timeout: retries are fast, and nothing times
/// out unless a test means it to.
fn options(base_url: &str) -> UpstreamOptions {
    let mut options = UpstreamOptions::new(Url::parse(base_url).expect("base url"));
    options.connect_timeout = Duration::from_secs(2);
    options.request_timeout = Duration::from_secs(5);
    options.max_retries = 3;
    options.backoff_min = Duration::from_millis(10);
    options.backoff_max = Duration::from_millis(50);
    options.max_retry_after = Duration::from_secs(5);
    options
}

fn client(options: UpstreamOptions) -> Upstream {
    Upstream::new(options).expect("upstream client")
}

/// A request body whose exact bytes (spacing, key order) are recognisable.
fn request_body(stream: bool) -> Bytes {
    Bytes::from(format!(
        r#"{{"model":"gpt-test",  "messages":[{{"role":"user","content":"héllo"}}], "stream":{stream}, "z":[1, 2]}}"#
    ))
}

async fn complete(upstream: &Upstream) -> Result<Value, UpstreamError> {
    tokio::time::timeout(WAIT, upstream.complete(request_body(false)))
        .await
        .expect("complete() returned in time")
}

/// Every chunk of a streamed answer, or the error that ended it.
async fn stream_all(upstream: &Upstream) -> Result<Vec<Value>, UpstreamError> {
    tokio::time::timeout(WAIT, async {
        let mut chunks = upstream.stream(request_body(true)).await?;
        let mut all = Vec::new();
        while let Some(chunk) = chunks.next().await {
            all.push(chunk?);
        }
        Ok(all)
    })
    .await
    .expect("stream() ended in time")
}

/// The gaps between consecutive requests as the upstream received them.
fn gaps(server: &ScriptedUpstream) -> Vec<Duration> {
    let requests = server.requests();
    requests
        .windows(2)
        .map(|pair| pair[1].received_at.duration_since(pair[0].received_at))
        .collect()
}

fn error_message(body: &[u8]) -> String {
    let body: Value = serde_json::from_slice(body).expect("provider body is JSON");
    body["error"]["message"]
        .as_str()
        .expect("error.message")
        .to_owned()
}

fn text_of(completion: &Value) -> &str {
    completion["choices"][0]["message"]["content"]
        .as_str()
        .expect("message content")
}

fn error_429(message: &str, retry_after: Option<u64>) -> Reply {
    Reply::Error {
        status: 429,
        message: message.into(),
        retry_after,
    }
}

// ---------------------------------------------------------------------------
// Configuration

#[test]
fn new_refuses_non_http_urls_and_bad_api_keys() {
    for url in ["ftp://h/v1", "file:///tmp/v1", "unix:/run/api.sock"] {
        let err = Upstream::new(options(url)).expect_err(url);
        assert!(
            matches!(err, UpstreamConfigError::Scheme(_)),
            "{url}: {err:?}"
        );
    }
    for key in ["sk-abc\ndef", "sk-abc\r\n", "sk-\0"] {
        let mut options = options("http://h/v1");
        options.api_key = Some(key.into());
        let err = Upstream::new(options).expect_err(key);
        assert!(
            matches!(err, UpstreamConfigError::ApiKey),
            "{key:?}: {err:?}"
        );
    }
    let mut with_key = options("https://h/v1");
    with_key.api_key = Some("sk-fine_KEY-123".into());
    Upstream::new(with_key).expect("a plain key is accepted");
}

#[test]
fn endpoint_appends_chat_completions_to_the_base_path() {
    for (base, endpoint) in [
        ("http://h/v1", "http://h/v1/chat/completions"),
        ("http://h/v1/", "http://h/v1/chat/completions"),
        ("http://h", "http://h/chat/completions"),
        ("http://h/", "http://h/chat/completions"),
        (
            "https://api.example.com:8443/openai/v1//",
            "https://api.example.com:8443/openai/v1/chat/completions",
        ),
    ] {
        assert_eq!(
            client(options(base)).endpoint().as_str(),
            endpoint,
            "{base}"
        );
    }
}

// ---------------------------------------------------------------------------
// complete()

#[tokio::test]
async fn complete_posts_the_exact_body_with_json_and_bearer_headers() {
    let server = ScriptedUpstream::start(Script::sequence([Reply::text("Hi there")])).await;
    let mut options = options(&server.base_url());
    options.api_key = Some("sk-test-123".into());
    let upstream = client(options);
    assert_eq!(
        upstream.endpoint().as_str(),
        server.chat_completions_url(),
        "posts to <base>/chat/completions"
    );

    let completion = complete(&upstream).await.expect("completion");
    assert_eq!(completion["object"], "chat.completion");
    assert_eq!(completion["model"], "gpt-test");
    assert_eq!(text_of(&completion), "Hi there");
    assert_eq!(completion["choices"][0]["finish_reason"], "stop");

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.raw, request_body(false), "body sent byte for byte");
    assert_eq!(request.headers["content-type"], "application/json");
    assert_eq!(request.headers["accept"], "application/json");
    assert_eq!(request.headers["authorization"], "Bearer sk-test-123");
}

#[tokio::test]
async fn complete_sends_no_authorization_without_an_api_key() {
    let server = ScriptedUpstream::start(Script::sequence([Reply::text("local")])).await;
    let upstream = client(options(&server.base_url()));
    let completion = complete(&upstream).await.expect("completion");
    assert_eq!(text_of(&completion), "local");
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert!(
        !requests[0].headers.contains_key("authorization"),
        "{:?}",
        requests[0].headers
    );
    assert_eq!(requests[0].headers["content-type"], "application/json");
}

#[tokio::test]
async fn complete_returns_tool_calls() {
    let server = ScriptedUpstream::start(Script::sequence([Reply::tool_call(
        "call_1",
        "lookup",
        json!({"q": "rust"}),
    )]))
    .await;
    let completion = complete(&client(options(&server.base_url())))
        .await
        .expect("completion");
    let choice = &completion["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["id"], "call_1");
    assert_eq!(call["function"]["name"], "lookup");
    assert_eq!(call["function"]["arguments"], r#"{"q":"rust"}"#);
}

#[tokio::test]
async fn client_errors_are_rejected_at_once_with_the_providers_answer() {
    for status in [400u16, 401, 404, 409, 422] {
        let message = format!("scripted {status}");
        let server =
            ScriptedUpstream::start(Script::sequence([Reply::error(status, &message)])).await;
        let err = complete(&client(options(&server.base_url())))
            .await
            .expect_err("rejected");
        let UpstreamError::Rejected {
            status: got,
            body,
            content_type,
        } = &err
        else {
            panic!("{status}: expected Rejected, got {err:?}");
        };
        assert_eq!(got.as_u16(), status);
        assert_eq!(error_message(body), message);
        assert_eq!(
            content_type.as_ref().expect("content type"),
            "application/json"
        );
        assert_eq!(err.http_status().as_u16(), status);
        let (forwarded, _) = err.provider_body().expect("provider body");
        assert_eq!(forwarded, body);
        assert_eq!(server.request_count(), 1, "{status} is not retried");
    }
}

#[tokio::test]
async fn server_errors_are_retried_until_success() {
    let server = ScriptedUpstream::start(Script::sequence([
        Reply::error(503, "overloaded"),
        Reply::error(500, "oops"),
        error_429("slow down", None),
        Reply::text("finally"),
    ]))
    .await;
    let completion = complete(&client(options(&server.base_url())))
        .await
        .expect("success after retries");
    assert_eq!(text_of(&completion), "finally");
    let requests = server.requests();
    assert_eq!(requests.len(), 4);
    for request in &requests {
        assert_eq!(
            request.raw,
            request_body(false),
            "every attempt sends the body"
        );
    }
}

#[tokio::test]
async fn backoff_grows_from_backoff_min() {
    let server = ScriptedUpstream::start(Script::sequence([
        Reply::error(503, "1"),
        Reply::error(503, "2"),
        Reply::error(503, "3"),
        Reply::text("ok"),
    ]))
    .await;
    let mut options = options(&server.base_url());
    options.backoff_min = Duration::from_millis(40);
    options.backoff_max = Duration::from_secs(1);
    complete(&client(options)).await.expect("success");
    let gaps = gaps(&server);
    assert_eq!(gaps.len(), 3);
    for (retry, gap) in gaps.iter().enumerate() {
        let least = Duration::from_millis(40 << retry);
        assert!(
            *gap >= least,
            "retry {retry} after {gap:?}, below {least:?}"
        );
    }
}

#[tokio::test]
async fn backoff_never_exceeds_backoff_max() {
    let server = ScriptedUpstream::start(Script::respond(|_, _| Reply::error(503, "busy"))).await;
    let mut options = options(&server.base_url());
    options.max_retries = 4;
    options.backoff_min = Duration::from_millis(100);
    options.backoff_max = Duration::from_millis(100);
    let err = complete(&client(options)).await.expect_err("fails");
    assert!(
        matches!(err, UpstreamError::Failed { attempts: 5, .. }),
        "{err:?}"
    );
    for gap in gaps(&server) {
        assert!(gap >= Duration::from_millis(100), "{gap:?}");
        // The jitter must stay within backoff_max; the slack is for the
        // request itself on a busy machine.
        assert!(gap < Duration::from_millis(170), "{gap:?}");
    }
}

#[tokio::test]
async fn retry_after_is_honoured() {
    let server = ScriptedUpstream::start(Script::sequence([
        error_429("wait a second", Some(1)),
        Reply::text("rested"),
    ]))
    .await;
    let completion = complete(&client(options(&server.base_url())))
        .await
        .expect("success after the pause");
    assert_eq!(text_of(&completion), "rested");
    assert_eq!(server.request_count(), 2);
    let gap = gaps(&server)[0];
    // The backoff alone would be at most 2 × 50 ms.
    assert!(gap >= Duration::from_secs(1), "retried after {gap:?}");
    assert!(gap < Duration::from_secs(3), "retried after {gap:?}");
}

#[tokio::test]
async fn retry_after_above_the_limit_ends_the_retries() {
    let server = ScriptedUpstream::start(Script::sequence([
        error_429("come back in a minute", Some(60)),
        Reply::text("never reached"),
    ]))
    .await;
    let mut options = options(&server.base_url());
    options.max_retry_after = Duration::from_secs(1);
    let started = Instant::now();
    let err = complete(&client(options)).await.expect_err("gives up");
    let elapsed = started.elapsed();
    let UpstreamError::Failed {
        status,
        body,
        content_type,
        attempts,
    } = &err
    else {
        panic!("expected Failed, got {err:?}");
    };
    assert_eq!(*status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(*attempts, 1);
    assert_eq!(error_message(body), "come back in a minute");
    assert_eq!(
        content_type.as_ref().expect("content type"),
        "application/json"
    );
    assert_eq!(err.http_status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(server.request_count(), 1);
    assert!(elapsed < Duration::from_millis(900), "took {elapsed:?}");
}

#[tokio::test]
async fn retries_run_out_with_the_last_answer() {
    let server = ScriptedUpstream::start(Script::respond(|_, index| {
        Reply::error(503, format!("overloaded {index}"))
    }))
    .await;
    let mut options = options(&server.base_url());
    options.max_retries = 2;
    let err = complete(&client(options)).await.expect_err("fails");
    let UpstreamError::Failed {
        status,
        body,
        attempts,
        ..
    } = &err
    else {
        panic!("expected Failed, got {err:?}");
    };
    assert_eq!(*status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(*attempts, 3);
    assert_eq!(error_message(body), "overloaded 2", "the last answer");
    assert_eq!(err.http_status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(server.request_count(), 3);
}

#[tokio::test]
async fn no_retries_means_one_attempt() {
    let server = ScriptedUpstream::start(Script::sequence([
        Reply::error(502, "bad gateway"),
        Reply::text("unused"),
    ]))
    .await;
    let mut options = options(&server.base_url());
    options.max_retries = 0;
    let err = complete(&client(options)).await.expect_err("fails");
    assert!(
        matches!(err, UpstreamError::Failed { status, attempts: 1, .. } if status == StatusCode::BAD_GATEWAY),
        "{err:?}"
    );
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn disconnects_are_retried() {
    let server =
        ScriptedUpstream::start(Script::sequence([Reply::Disconnect, Reply::text("back")])).await;
    let completion = complete(&client(options(&server.base_url())))
        .await
        .expect("success after a disconnect");
    assert_eq!(text_of(&completion), "back");
    assert_eq!(server.request_count(), 2);
}

#[tokio::test]
async fn constant_disconnects_are_unreachable() {
    let server = ScriptedUpstream::start(Script::respond(|_, _| Reply::Disconnect)).await;
    let mut options = options(&server.base_url());
    options.max_retries = 2;
    let err = complete(&client(options)).await.expect_err("fails");
    assert!(
        matches!(err, UpstreamError::Unreachable { attempts: 3, .. }),
        "{err:?}"
    );
    assert_eq!(err.http_status(), StatusCode::BAD_GATEWAY);
    assert!(err.provider_body().is_none());
    assert_eq!(server.request_count(), 3);
}

#[tokio::test]
async fn connection_refused_is_unreachable_after_every_attempt() {
    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        listener.local_addr().expect("address")
    };
    let mut options = options(&format!("http://{closed}/v1"));
    options.max_retries = 2;
    let started = Instant::now();
    let err = complete(&client(options)).await.expect_err("fails");
    let UpstreamError::Unreachable { message, attempts } = &err else {
        panic!("expected Unreachable, got {err:?}");
    };
    assert_eq!(*attempts, 3);
    assert!(!message.is_empty());
    assert_eq!(err.http_status(), StatusCode::BAD_GATEWAY);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_slow_answer_times_out() {
    let server = ScriptedUpstream::start(Script::sequence([
        Reply::text("too late").delayed(Duration::from_secs(2))
    ]))
    .await;
    let mut options = options(&server.base_url());
    options.request_timeout = Duration::from_millis(200);
    options.max_retries = 0;
    let started = Instant::now();
    let err = complete(&client(options)).await.expect_err("times out");
    let elapsed = started.elapsed();
    assert!(
        matches!(err, UpstreamError::Timeout { after, attempts: 1 } if after == Duration::from_millis(200)),
        "{err:?}"
    );
    assert_eq!(err.http_status(), StatusCode::GATEWAY_TIMEOUT);
    assert!(elapsed >= Duration::from_millis(200), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(1), "{elapsed:?}");
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn timeouts_are_retried() {
    let server = ScriptedUpstream::start(Script::sequence([
        Reply::text("too late").delayed(Duration::from_secs(2)),
        Reply::text("in time"),
    ]))
    .await;
    let mut options = options(&server.base_url());
    options.request_timeout = Duration::from_millis(200);
    options.max_retries = 1;
    let started = Instant::now();
    let completion = complete(&client(options)).await.expect("second attempt");
    assert_eq!(text_of(&completion), "in time");
    assert_eq!(server.request_count(), 2);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------
// stream()

/// The concatenated `delta.content` of streamed chunks.
fn streamed_text(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str())
        .collect()
}

fn finish_reason(chunks: &[Value]) -> Option<&str> {
    chunks
        .iter()
        .find_map(|chunk| chunk["choices"][0]["finish_reason"].as_str())
}

#[tokio::test]
async fn stream_reassembles_text_and_ends_at_done() {
    let text = "Streaming answers arrive in pieces, ünïcödé included, and end with DONE.";
    let server = ScriptedUpstream::start(Script::sequence([Reply::text(text)])).await;
    let mut options = options(&server.base_url());
    options.api_key = Some("sk-stream".into());
    let upstream = client(options);
    let mut chunks = upstream.stream(request_body(true)).await.expect("stream");
    let mut all = Vec::new();
    while let Some(chunk) = tokio::time::timeout(WAIT, chunks.next())
        .await
        .expect("chunk in time")
    {
        all.push(chunk.expect("chunk"));
    }
    // A stream that ended stays ended.
    assert!(chunks.next().await.is_none());

    let pieces = 3.max(text.chars().count().div_ceil(16));
    assert_eq!(all.len(), 1 + pieces + 1, "role, pieces, finish: {all:#?}");
    for chunk in &all {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], "gpt-test");
    }
    assert_eq!(all[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(streamed_text(&all), text);
    assert_eq!(finish_reason(&all), Some("stop"));

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].raw, request_body(true));
    assert_eq!(requests[0].headers["accept"], "text/event-stream");
    assert_eq!(requests[0].headers["content-type"], "application/json");
    assert_eq!(requests[0].headers["authorization"], "Bearer sk-stream");
}

#[tokio::test]
async fn stream_carries_tool_call_deltas() {
    let arguments = json!({"query": "what is the airspeed of an unladen swallow", "n": 3});
    let server = ScriptedUpstream::start(Script::sequence([Reply::tool_call(
        "call_42",
        "search",
        arguments.clone(),
    )]))
    .await;
    let chunks = stream_all(&client(options(&server.base_url())))
        .await
        .expect("stream");
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|chunk| chunk["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert!(
        deltas.len() >= 3,
        "a header and argument pieces: {deltas:#?}"
    );
    assert!(deltas.iter().all(|delta| delta["index"] == 0));
    assert_eq!(deltas[0]["id"], "call_42");
    assert_eq!(deltas[0]["function"]["name"], "search");
    let streamed: String = deltas
        .iter()
        .filter_map(|delta| delta["function"]["arguments"].as_str())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&streamed).expect("arguments"),
        arguments
    );
    assert_eq!(finish_reason(&chunks), Some("tool_calls"));
}

#[tokio::test]
async fn stream_errors_are_classified_like_complete() {
    // Rejected at once.
    let server = ScriptedUpstream::start(Script::sequence([Reply::error(400, "bad tools")])).await;
    let err = stream_all(&client(options(&server.base_url())))
        .await
        .expect_err("rejected");
    let UpstreamError::Rejected { status, body, .. } = &err else {
        panic!("expected Rejected, got {err:?}");
    };
    assert_eq!(*status, StatusCode::BAD_REQUEST);
    assert_eq!(error_message(body), "bad tools");
    assert_eq!(server.request_count(), 1);

    // Retried, then failed.
    let server = ScriptedUpstream::start(Script::respond(|_, _| Reply::error(503, "down"))).await;
    let mut options_2 = options(&server.base_url());
    options_2.max_retries = 2;
    let err = stream_all(&client(options_2)).await.expect_err("failed");
    assert!(
        matches!(&err, UpstreamError::Failed { status, attempts: 3, .. } if *status == StatusCode::SERVICE_UNAVAILABLE),
        "{err:?}"
    );
    assert_eq!(server.request_count(), 3);

    // Retried, then streamed.
    let server = ScriptedUpstream::start(Script::sequence([
        Reply::error(500, "hiccup"),
        Reply::Disconnect,
        Reply::text("recovered"),
    ]))
    .await;
    let chunks = stream_all(&client(options(&server.base_url())))
        .await
        .expect("stream after retries");
    assert_eq!(streamed_text(&chunks), "recovered");
    assert_eq!(server.request_count(), 3);

    // Too slow to start.
    let server = ScriptedUpstream::start(Script::sequence([
        Reply::text("late").delayed(Duration::from_secs(2))
    ]))
    .await;
    let mut options_4 = options(&server.base_url());
    options_4.request_timeout = Duration::from_millis(200);
    options_4.max_retries = 0;
    let started = Instant::now();
    let err = stream_all(&client(options_4)).await.expect_err("timeout");
    assert!(
        matches!(err, UpstreamError::Timeout { attempts: 1, .. }),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn stream_timeout_applies_to_each_event_not_the_whole_stream() {
    let text = "a slow but steady stream of many small pieces";
    let server = ScriptedUpstream::start_with(
        Script::sequence([Reply::text(text)]),
        ServerOptions::new().with_chunk_delay(Some(Duration::from_millis(60))),
    )
    .await;
    let mut options = options(&server.base_url());
    options.request_timeout = Duration::from_millis(300);
    let started = Instant::now();
    let chunks = stream_all(&client(options)).await.expect("stream");
    assert_eq!(streamed_text(&chunks), text);
    // More events than fit in one request_timeout.
    assert!(
        started.elapsed() > Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------
// A hand-written HTTP/1.1 server, for answers the scripted upstream never
// gives. Each connection serves one request and is closed after the answer.

/// What the raw server does for one request.
enum Raw {
    /// Writes these bytes and closes the connection.
    Answer(String),
    /// Writes these bytes and then keeps the connection open, silent.
    Stall(String),
}

/// One request as the raw server read it.
#[derive(Debug, Clone)]
struct RawRequest {
    /// The request line and headers.
    head: String,
    body: Vec<u8>,
    received_at: Instant,
}

struct RawServer {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<RawRequest>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RawServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RawServer {
    async fn start(script: Vec<Raw>) -> RawServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let requests: Arc<Mutex<Vec<RawRequest>>> = Arc::default();
        let script = Arc::new(script);
        let task = tokio::spawn({
            let requests = requests.clone();
            async move {
                let mut connections = tokio::task::JoinSet::new();
                while let Ok((socket, _)) = listener.accept().await {
                    connections.spawn(serve_one(socket, requests.clone(), script.clone()));
                }
            }
        });
        RawServer {
            addr,
            requests,
            task,
        }
    }

    fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    fn requests(&self) -> Vec<RawRequest> {
        self.requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

async fn serve_one(
    mut socket: TcpStream,
    requests: Arc<Mutex<Vec<RawRequest>>>,
    script: Arc<Vec<Raw>>,
) {
    let mut buffer = Vec::new();
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let mut chunk = [0u8; 4096];
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let length = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    while buffer.len() < head_end + length {
        let mut chunk = [0u8; 4096];
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
    let index = {
        let mut requests = requests.lock().unwrap_or_else(PoisonError::into_inner);
        requests.push(RawRequest {
            head,
            body: buffer[head_end..head_end + length].to_vec(),
            received_at: Instant::now(),
        });
        requests.len() - 1
    };
    match script.get(index) {
        Some(Raw::Answer(answer)) => {
            let _ = socket.write_all(answer.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
        Some(Raw::Stall(answer)) => {
            let _ = socket.write_all(answer.as_bytes()).await;
            let _ = socket.flush().await;
            std::future::pending::<()>().await;
        }
        None => {
            let answer = http("500 Internal Server Error", "application/json", "{}");
            let _ = socket.write_all(answer.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
    }
}

/// A complete HTTP/1.1 answer that closes the connection.
fn http(status: &str, content_type: &str, body: &str) -> String {
    http_with(status, &[("content-type", content_type)], body)
}

fn http_with(status: &str, headers: &[(&str, &str)], body: &str) -> String {
    let mut answer = format!("HTTP/1.1 {status}\r\n");
    for (name, value) in headers {
        answer.push_str(&format!("{name}: {value}\r\n"));
    }
    answer.push_str(&format!(
        "content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    ));
    answer
}

fn completion_json(text: &str) -> String {
    json!({
        "id": "chatcmpl-raw",
        "object": "chat.completion",
        "created": 0,
        "model": "raw",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop",
        }],
    })
    .to_string()
}

fn chunk_json(content: &str) -> String {
    json!({
        "id": "chatcmpl-raw",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "raw",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}],
    })
    .to_string()
}

#[tokio::test]
async fn the_request_line_targets_base_path_chat_completions() {
    let server = RawServer::start(vec![Raw::Answer(http(
        "200 OK",
        "application/json",
        &completion_json("raw hello"),
    ))])
    .await;
    let completion = complete(&client(options(&format!("{}/", server.base_url()))))
        .await
        .expect("completion");
    assert_eq!(text_of(&completion), "raw hello");
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert!(
        requests[0]
            .head
            .starts_with("POST /v1/chat/completions HTTP/1.1\r\n"),
        "{}",
        requests[0].head
    );
    assert_eq!(requests[0].body, request_body(false));
}

#[tokio::test]
async fn a_success_that_is_not_a_chat_completion_is_invalid() {
    for body in ["this is not json", "[1, 2, 3]", "\"a string\"", ""] {
        let server = RawServer::start(vec![
            Raw::Answer(http("200 OK", "application/json", body)),
            Raw::Answer(http(
                "200 OK",
                "application/json",
                &completion_json("unused"),
            )),
        ])
        .await;
        let err = complete(&client(options(&server.base_url())))
            .await
            .expect_err(body);
        assert!(
            matches!(err, UpstreamError::InvalidResponse(_)),
            "{body:?}: {err:?}"
        );
        assert_eq!(err.http_status(), StatusCode::BAD_GATEWAY);
        assert!(err.provider_body().is_none());
        assert_eq!(server.requests().len(), 1, "{body:?} is not retried");
    }
}

#[tokio::test]
async fn retry_after_ms_takes_precedence_over_retry_after() {
    let rate_limited = http_with(
        "429 Too Many Requests",
        &[
            ("content-type", "application/json"),
            ("retry-after", "30"),
            ("retry-after-ms", "150"),
        ],
        r#"{"error":{"message":"rate limited"}}"#,
    );
    let server = RawServer::start(vec![
        Raw::Answer(rate_limited),
        Raw::Answer(http("200 OK", "application/json", &completion_json("ok"))),
    ])
    .await;
    let mut options = options(&server.base_url());
    options.max_retry_after = Duration::from_secs(1);
    let completion = complete(&client(options)).await.expect("retried");
    assert_eq!(text_of(&completion), "ok");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let gap = requests[1]
        .received_at
        .duration_since(requests[0].received_at);
    assert!(gap >= Duration::from_millis(150), "{gap:?}");
    assert!(gap < Duration::from_secs(1), "{gap:?}");
}

#[tokio::test]
async fn a_success_body_that_stalls_times_out() {
    let stalled = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                   content-length: 1000\r\n\r\n{\"id\":";
    let server = RawServer::start(vec![Raw::Stall(stalled.into())]).await;
    let mut options = options(&server.base_url());
    options.request_timeout = Duration::from_millis(200);
    let started = Instant::now();
    let err = complete(&client(options)).await.expect_err("times out");
    assert!(
        matches!(err, UpstreamError::Timeout { attempts: 1, .. }),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn an_error_body_that_stalls_does_not_hang_the_retries() {
    let stalled = "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
                   content-length: 1000\r\n\r\n{\"error\":";
    let server =
        RawServer::start(vec![Raw::Stall(stalled.into()), Raw::Stall(stalled.into())]).await;
    let mut options = options(&server.base_url());
    options.request_timeout = Duration::from_millis(200);
    options.max_retries = 1;
    let started = Instant::now();
    let err = complete(&client(options)).await.expect_err("fails");
    assert!(
        matches!(&err, UpstreamError::Failed { status, attempts: 2, .. } if *status == StatusCode::SERVICE_UNAVAILABLE),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn a_rejection_body_that_stalls_does_not_hang() {
    let stalled = "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n\
                   content-length: 1000\r\n\r\n{\"error\":";
    let server = RawServer::start(vec![Raw::Stall(stalled.into())]).await;
    let mut options = options(&server.base_url());
    options.request_timeout = Duration::from_millis(200);
    let started = Instant::now();
    let err = complete(&client(options)).await.expect_err("rejected");
    assert!(
        matches!(&err, UpstreamError::Rejected { status, .. } if *status == StatusCode::BAD_REQUEST),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn stream_ignores_comments_and_stops_at_done() {
    let events = format!(
        ": keep-alive\n\ndata: {}\n\n: ping\n\ndata: {}\n\ndata: [DONE]\n\ndata: {}\n\n",
        chunk_json("Hel"),
        chunk_json("lo"),
        chunk_json(" after done"),
    );
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n{events}"
    );
    let server = RawServer::start(vec![Raw::Answer(answer)]).await;
    let chunks = stream_all(&client(options(&server.base_url())))
        .await
        .expect("stream");
    assert_eq!(chunks.len(), 2, "{chunks:#?}");
    assert_eq!(streamed_text(&chunks), "Hello");
}

#[tokio::test]
async fn a_stream_that_goes_silent_is_a_stream_error() {
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: {}\n\n",
        chunk_json("first")
    );
    let server = RawServer::start(vec![Raw::Stall(answer)]).await;
    let mut options = options(&server.base_url());
    options.request_timeout = Duration::from_millis(200);
    let started = Instant::now();
    let mut chunks = upstream_stream(&client(options)).await;
    let first = chunks.next().await.expect("an item").expect("first chunk");
    assert_eq!(streamed_text(&[first]), "first");
    let err = chunks
        .next()
        .await
        .expect("an item")
        .expect_err("silence is an error");
    assert!(matches!(err, UpstreamError::Stream(_)), "{err:?}");
    assert_eq!(err.http_status(), StatusCode::BAD_GATEWAY);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(server.requests().len(), 1, "streams are not retried");
}

#[tokio::test]
async fn a_chunk_that_is_not_json_is_a_stream_error() {
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n\
         data: {}\n\ndata: {{not json\n\ndata: [DONE]\n\n",
        chunk_json("ok")
    );
    let server = RawServer::start(vec![Raw::Answer(answer)]).await;
    let err = stream_all(&client(options(&server.base_url())))
        .await
        .expect_err("invalid chunk");
    assert!(matches!(err, UpstreamError::Stream(_)), "{err:?}");
}

async fn upstream_stream(upstream: &Upstream) -> quiver_upstream::ChunkStream {
    tokio::time::timeout(WAIT, upstream.stream(request_body(true)))
        .await
        .expect("stream() returned in time")
        .expect("stream")
}

#[tokio::test]
async fn a_stream_cut_off_before_done_is_a_stream_error() {
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\ndata: {}\n\n",
        chunk_json("partial")
    );
    let server = RawServer::start(vec![Raw::Answer(answer)]).await;
    let mut chunks = upstream_stream(&client(options(&server.base_url()))).await;
    let first = chunks.next().await.expect("an item").expect("first chunk");
    assert_eq!(streamed_text(&[first]), "partial");
    let err = chunks.next().await.expect("an item").unwrap_err();
    assert!(
        matches!(&err, UpstreamError::Stream(message) if message.contains("[DONE]")),
        "{err:?}"
    );
    assert!(
        chunks.next().await.is_none(),
        "the stream ends after the error"
    );
    assert!(chunks.next().await.is_none(), "and stays ended");
}

#[tokio::test]
async fn an_error_body_is_kept_only_up_to_a_limit() {
    let huge = "x".repeat(1024 * 1024);
    let server = RawServer::start(vec![Raw::Answer(http(
        "400 Bad Request",
        "text/plain",
        &huge,
    ))])
    .await;
    let err = complete(&client(options(&server.base_url())))
        .await
        .unwrap_err();
    let (body, _) = err.provider_body().expect("the provider's body");
    assert_eq!(body.len(), 64 * 1024, "the start of the body is kept");
}
