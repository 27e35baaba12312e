//! A request answered on an SSE stream holding nothing but its answer is
//! handed to rmcp as if the server had answered JSON.
//!
//! Servers of both eras (the TypeScript and Python SDKs, rmcp's own) answer
//! a streamable-HTTP `POST` with a one-event stream unless configured
//! otherwise. rmcp's client reads such a stream on a task of its own,
//! through its resuming SSE stream and one more channel to its transport
//! worker: per call, a task and two hand-offs more than a JSON answer takes
//! (issue #23; `benches/http_upstream.rs` of `quiver-worker`). The
//! [`AnswerFirst`] client reads the stream's first events where the `POST`
//! is awaited: when the first message is the answer to the request, rmcp gets
//! it as a JSON answer and the rest of the stream (its end, in practice) is
//! read to its end in the background, so the HTTP connection goes back to
//! the pool. Anything else (a progress notification, a server request, an
//! error) hands rmcp the stream as it was, the events already read first,
//! so it sees the same sequence it would have. A `tools/call` answer is
//! read as one ([`Expected::read`]): rmcp's reading of a result as every
//! result type in turn took ~17 us of a call (BENCHMARKS.md, "Where a tool
//! API call's time goes").

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use futures::stream::{self, BoxStream, StreamExt as _};
use http::{HeaderName, HeaderValue};
use rmcp::model::{
    CallToolResult, ClientJsonRpcMessage, ClientRequest, JsonRpcVersion2_0, RequestId,
    ServerJsonRpcMessage, ServerResult,
};
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use serde::Deserialize;

/// How long the rest of an answered stream is read before the connection is
/// given up (rmcp waits as long for the same).
const DRAIN: Duration = Duration::from_millis(50);
/// Events without data (priming events, keep-alives) looked past before the
/// stream is handed to rmcp as it is.
const MAX_EMPTY: usize = 4;

type SseStream = BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>>;

/// The session id of a connection's server, as its `initialize` answer gave
/// it (recorded by [`AnswerFirst`], also when rmcp opens a new session
/// after the old one expired), for [`crate::direct_call`].
#[derive(Debug, Default)]
pub struct SeenSession(Mutex<Option<Option<Arc<str>>>>);

impl SeenSession {
    /// What the server's `initialize` answered: its session id, or none.
    pub fn record(&self, id: Option<&str>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(id.map(Arc::from));
    }

    /// `None` until an `initialize` was answered; then the session id, if
    /// the server gave one.
    pub fn current(&self) -> Option<Option<Arc<str>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A [`StreamableHttpClient`] whose `POST`s answered by a stream that starts
/// with the answer come back as JSON answers (see the module docs); the
/// session id of every `initialize` answer is recorded in `session`.
#[derive(Clone)]
pub struct AnswerFirst<C> {
    pub client: C,
    pub session: Arc<SeenSession>,
}

impl<C> AnswerFirst<C> {
    /// The answer to `message` as [`answer_first`] makes it; an
    /// `initialize` answer's session id recorded.
    async fn answered(
        &self,
        expected: Option<Expected>,
        response: StreamableHttpPostResponse,
    ) -> StreamableHttpPostResponse {
        if expected
            .as_ref()
            .is_some_and(|e| e.method == Method::Initialize)
            && let StreamableHttpPostResponse::Json(_, session)
            | StreamableHttpPostResponse::Sse(_, session) = &response
        {
            self.session.record(session.as_deref());
        }
        answer_first(response, expected).await
    }
}

/// The answer a request waits for: its id, and what its answer means here.
struct Expected {
    id: RequestId,
    method: Method,
}

/// The requests whose answers are handled apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    /// Its answer carries the session id.
    Initialize,
    /// Its answer is read as a tool's result ([`Expected::read`]).
    ToolCall,
    Other,
}

impl Expected {
    /// What `message` waits for; `None` for a message that is no request.
    fn of(message: &ClientJsonRpcMessage) -> Option<Expected> {
        let ClientJsonRpcMessage::Request(request) = message else {
            return None;
        };
        let method = match request.request {
            ClientRequest::InitializeRequest(_) => Method::Initialize,
            ClientRequest::CallToolRequest(_) => Method::ToolCall,
            _ => Method::Other,
        };
        Some(Expected {
            id: request.id.clone(),
            method,
        })
    }

    /// `data` read as a message. A `tools/call` answer whose result is a
    /// complete `CallToolResult` (every call's but an `input_required` or
    /// a task's) is read as one: rmcp's `ServerResult` is an untagged union
    /// of every result type, which tries (and builds an error for) the
    /// fifteen listed before `CallToolResult` first. Anything else is read
    /// as rmcp reads it.
    fn read(&self, data: &str) -> Option<ServerJsonRpcMessage> {
        if self.method == Method::ToolCall
            && let Ok(answer) = serde_json::from_str::<ToolCallAnswer>(data)
        {
            return Some(ServerJsonRpcMessage::response(
                ServerResult::CallToolResult(answer.result),
                answer.id,
            ));
        }
        serde_json::from_str(data).ok()
    }
}

/// A JSON-RPC answer carrying a complete tool call result.
#[derive(Deserialize)]
struct ToolCallAnswer {
    #[serde(rename = "jsonrpc")]
    _jsonrpc: JsonRpcVersion2_0,
    id: RequestId,
    result: CallToolResult,
}

/// The answer `expected` is waiting for, if it is the first message of
/// `response`'s stream; otherwise `response` as it was.
async fn answer_first(
    response: StreamableHttpPostResponse,
    expected: Option<Expected>,
) -> StreamableHttpPostResponse {
    let Some(expected) = expected else {
        return response;
    };
    let StreamableHttpPostResponse::Sse(mut events, session) = response else {
        return response;
    };
    let mut read = Vec::new();
    while let Some(event) = events.next().await {
        let data = match &event {
            Ok(sse) => sse.data.as_deref().unwrap_or_default().trim(),
            Err(_) => "",
        };
        // A priming event (an id to resume from, no data) precedes the
        // messages of a resumable stream.
        if event.is_ok() && data.is_empty() && read.len() < MAX_EMPTY {
            read.push(event);
            continue;
        }
        if let Some(message @ (ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_))) =
            expected.read(data)
            && answers(&message, &expected.id)
        {
            drain(events);
            return StreamableHttpPostResponse::Json(message, session);
        }
        read.push(event);
        break;
    }
    StreamableHttpPostResponse::Sse(stream::iter(read).chain(events).boxed(), session)
}

/// Whether `message` is the answer to request `id`.
fn answers(message: &ServerJsonRpcMessage, id: &RequestId) -> bool {
    match message {
        ServerJsonRpcMessage::Response(response) => &response.id == id,
        ServerJsonRpcMessage::Error(error) => error.id.as_ref() == Some(id),
        _ => false,
    }
}

/// Reads what is left of an answered stream, so its connection can serve
/// the next request: at once when its end has arrived with the answer, else
/// on a task of its own, for at most [`DRAIN`].
fn drain(mut events: SseStream) {
    loop {
        match events.next().now_or_never() {
            Some(Some(_)) => continue,
            Some(None) => return,
            None => break,
        }
    }
    tokio::spawn(async move {
        let _ = tokio::time::timeout(DRAIN, async { while events.next().await.is_some() {} }).await;
    });
}

impl<C: StreamableHttpClient + Sync> StreamableHttpClient for AnswerFirst<C> {
    type Error = C::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let expected = Expected::of(&message);
        let posted =
            self.client
                .post_message(uri, message, session_id, auth_header, custom_headers);
        Ok(self.answered(expected, posted.await?).await)
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let expected = Expected::of(&message);
        let posted = self.client.post_message_with_max_sse_event_size(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            max_sse_event_size,
        );
        Ok(self.answered(expected, posted.await?).await)
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let expected = Expected::of(&message);
        let posted = self.client.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        );
        Ok(self.answered(expected, posted.await?).await)
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.client
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<SseStream, StreamableHttpError<Self::Error>> {
        self.client
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<SseStream, StreamableHttpError<Self::Error>> {
        self.client
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(data: &str, id: Option<&str>) -> Result<sse_stream::Sse, sse_stream::Error> {
        Ok(sse_stream::Sse {
            event: Some("message".into()),
            data: Some(data.into()),
            id: id.map(Into::into),
            retry: None,
        })
    }

    const ANSWER: &str = r#"{"jsonrpc":"2.0","id":7,"result":{"content":[]}}"#;
    const PROGRESS: &str = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}"#;

    /// What a `tools/call` with id `id` waits for.
    fn call(id: i64) -> Option<Expected> {
        Some(Expected {
            id: RequestId::Number(id),
            method: Method::ToolCall,
        })
    }

    fn sse(events: Vec<Result<sse_stream::Sse, sse_stream::Error>>) -> StreamableHttpPostResponse {
        StreamableHttpPostResponse::Sse(stream::iter(events).boxed(), Some("session".into()))
    }

    /// The data of the events a response still carries as a stream.
    async fn remaining(response: StreamableHttpPostResponse) -> Vec<String> {
        let StreamableHttpPostResponse::Sse(events, _) = response else {
            panic!("not a stream: {response:?}");
        };
        events
            .map(|event| {
                event
                    .map(|e| e.data.unwrap_or_default())
                    .unwrap_or_else(|e| format!("error: {e}"))
            })
            .collect()
            .await
    }

    #[tokio::test]
    async fn an_answer_alone_after_a_priming_event_comes_back_as_json() {
        let response = answer_first(
            sse(vec![event("", Some("0")), event(ANSWER, Some("1"))]),
            call(7),
        )
        .await;
        let StreamableHttpPostResponse::Json(ServerJsonRpcMessage::Response(answer), session) =
            response
        else {
            panic!("not a JSON answer: {response:?}");
        };
        assert_eq!(answer.id, RequestId::Number(7));
        assert_eq!(session.as_deref(), Some("session"));
    }

    #[tokio::test]
    async fn a_stream_starting_with_anything_else_is_handed_on_whole() {
        let response = answer_first(
            sse(vec![
                event("", Some("0")),
                event(PROGRESS, None),
                event(ANSWER, None),
            ]),
            call(7),
        )
        .await;
        assert_eq!(remaining(response).await, ["", PROGRESS, ANSWER]);
    }

    #[tokio::test]
    async fn an_answer_to_another_request_or_a_broken_stream_is_handed_on_whole() {
        let other = answer_first(sse(vec![event(ANSWER, None)]), call(8)).await;
        assert_eq!(remaining(other).await, [ANSWER]);
        let broken = answer_first(
            sse(vec![
                Err(sse_stream::Error::InvalidLine),
                event(ANSWER, None),
            ]),
            call(7),
        )
        .await;
        assert_eq!(remaining(broken).await.len(), 2);
        let notification = answer_first(sse(vec![event(ANSWER, None)]), None).await;
        assert_eq!(remaining(notification).await, [ANSWER]);
    }

    #[test]
    fn a_tool_call_answer_reads_as_rmcp_reads_it() {
        let expected = call(7).expect("a request");
        for data in [
            r#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"hi"}],"isError":false}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"complete","structuredContent":null,"_meta":{"k":1}}}"#,
            // Not a complete tool result: read as rmcp reads it.
            r#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"input_required","requestState":"s"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"_meta":{"k":1}}}"#,
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"unknown tool"}}"#,
            r#"{"jsonrpc":"1.0","id":7,"result":{"content":[]}}"#,
        ] {
            let ours = expected
                .read(data)
                .map(|m| serde_json::to_value(m).expect("JSON"));
            let rmcp = serde_json::from_str::<ServerJsonRpcMessage>(data)
                .ok()
                .map(|m| serde_json::to_value(m).expect("JSON"));
            assert_eq!(ours, rmcp, "{data}");
        }
    }
}
