//! The stdio transport: rmcp's JSON-RPC message types and line codec over a
//! child's stdin and stdout, with a reader that bounds every message.
//!
//! rmcp's own stdio transport drops a line over its size limit, or one it
//! cannot parse (a schema nested deeper than serde_json's recursion limit),
//! and the request it answered then waits for its whole timeout. This reader
//! never buffers more than `max_message_bytes` of a line: it streams over a
//! longer one, recovers the line's JSON-RPC `id` with a [`TopLevelScan`] and
//! hands rmcp a JSON-RPC error for that id instead, so the request fails at
//! once with an error that says why ([`dropped_answer`]). A line it cannot
//! attribute to a request (a notification) is dropped and counted in
//! `mcp_messages_dropped_total{server_id,reason}`, its warning rate-limited.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::SinkExt as _;
use process_wrap::tokio::{ChildWrapper, CommandWrap};
use rmcp::RoleClient;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::JsonRpcMessageCodec;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncWrite, BufReader};
use tokio::process::{ChildStderr, ChildStdin, ChildStdout};
use tokio_util::codec::FramedWrite;

use crate::dropped::DropReason;
use crate::json_scan::TopLevelScan;
use crate::server_log::ServerLog;

/// Default of `max_message_bytes` (as rmcp's own line limit).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 << 20;
/// How long a child gets to exit after its stdin closes, and again after SIGTERM.
const EXIT_WAIT: Duration = Duration::from_secs(3);
/// Read buffer of the child's stdout.
const READ_BUFFER: usize = 64 * 1024;
/// A line buffer grown past this is given back after the line.
const KEEP_BUFFER: usize = 1 << 20;

type Writer<W> = FramedWrite<W, JsonRpcMessageCodec<TxJsonRpcMessage<RoleClient>>>;

/// Rate-limited event kind of an unparsable line that answers no request.
const IGNORED_MESSAGE: &str = "ignored_message";

/// A stdio MCP client transport over `read` (the server's stdout) and
/// `write` (its stdin), owning the child process when there is one.
pub struct StdioTransport<R, W> {
    child: ChildGuard,
    reader: MessageReader<R>,
    write: Arc<tokio::sync::Mutex<Option<Writer<W>>>>,
}

/// A spawned stdio server: its transport, pid and stderr pipe.
pub type SpawnedStdio = (
    StdioTransport<ChildStdout, ChildStdin>,
    Option<u32>,
    Option<ChildStderr>,
);

impl StdioTransport<ChildStdout, ChildStdin> {
    /// Spawns `command` with piped stdin, stdout and stderr.
    pub fn spawn(
        mut command: CommandWrap,
        max_message_bytes: usize,
        log: &ServerLog,
    ) -> std::io::Result<SpawnedStdio> {
        command
            .command_mut()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn()?;
        let pipes = (
            child.inner_mut().stdout().take(),
            child.inner_mut().stdin().take(),
        );
        let stderr = child.inner_mut().stderr().take();
        let pid = child.id();
        let guard = ChildGuard(Some(child));
        let (Some(stdout), Some(stdin)) = pipes else {
            return Err(std::io::Error::other("child stdio pipes missing"));
        };
        let mut transport = StdioTransport::new(stdout, stdin, max_message_bytes, log);
        transport.child = guard;
        Ok((transport, pid, stderr))
    }
}

impl<R: AsyncRead + Unpin, W: AsyncWrite + Unpin> StdioTransport<R, W> {
    /// A transport over `read` and `write`, with no child process.
    pub fn new(read: R, write: W, max_message_bytes: usize, log: &ServerLog) -> Self {
        StdioTransport {
            child: ChildGuard(None),
            reader: MessageReader {
                read: BufReader::with_capacity(READ_BUFFER, read),
                line: Vec::new(),
                oversized: None,
                max_bytes: max_message_bytes,
                log: log.clone(),
            },
            write: Arc::new(tokio::sync::Mutex::new(Some(FramedWrite::new(
                write,
                JsonRpcMessageCodec::default(),
            )))),
        }
    }
}

impl<R, W> Transport<RoleClient> for StdioTransport<R, W>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let write = self.write.clone();
        async move {
            match write.lock().await.as_mut() {
                Some(write) => write.send(item).await.map_err(Into::into),
                None => Err(std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    "transport is closed",
                )),
            }
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        self.reader.next_message().await
    }

    /// Closes the server's stdin; a child then gets [`EXIT_WAIT`] to exit,
    /// then SIGTERM and as long again, then SIGKILL (the stdio shutdown of
    /// the MCP specification).
    async fn close(&mut self) -> Result<(), Self::Error> {
        drop(self.write.lock().await.take());
        let Some(child) = self.child.0.as_mut() else {
            return Ok(());
        };
        if !exited(child).await
            && (child
                .signal(nix::sys::signal::Signal::SIGTERM as i32)
                .is_err()
                || !exited(child).await)
        {
            Box::into_pin(child.kill()).await?;
        }
        self.child.0 = None;
        Ok(())
    }
}

/// Whether `child` exits within [`EXIT_WAIT`].
async fn exited(child: &mut Box<dyn ChildWrapper>) -> bool {
    matches!(
        tokio::time::timeout(EXIT_WAIT, child.wait()).await,
        Ok(Ok(_))
    )
}

/// Kills the child when the transport is dropped without being closed.
struct ChildGuard(Option<Box<dyn ChildWrapper>>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let Some(mut child) = self.0.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            // `kill` also waits, so the child is reaped.
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _ = Box::into_pin(child.kill()).await;
                });
            }
            Err(_) => {
                let _ = child.start_kill();
            }
        }
    }
}

/// A line over the limit, being streamed over.
struct Oversized {
    scan: TopLevelScan,
    bytes: usize,
}

/// What one bounded read of a line found.
enum Frame {
    /// A whole line is in `MessageReader::line`.
    Line,
    /// A line over the limit ended; it was not kept.
    Oversized(Oversized),
    /// The stream ended or failed.
    End,
}

/// What a message line the reader could not take becomes.
enum Refusal {
    TooLarge(usize),
    Unparsable(serde_json::Error),
}

struct MessageReader<R> {
    read: BufReader<R>,
    /// The line read so far (never more than `max_bytes`).
    line: Vec<u8>,
    /// Set while streaming over a line over the limit. Both live here, not
    /// in a local of `next_frame`: `receive` is polled in a `select!` and
    /// may be cancelled between reads; the next call resumes the line.
    oversized: Option<Oversized>,
    max_bytes: usize,
    log: ServerLog,
}

impl<R: AsyncRead + Unpin> MessageReader<R> {
    /// Reads up to the end of the next line. Cancel safe: each step
    /// consumes exactly what it stored, with no await in between.
    async fn next_frame(&mut self) -> Frame {
        loop {
            let available = match self.read.fill_buf().await {
                Ok([]) => return Frame::End,
                Ok(available) => available,
                Err(err) => {
                    tracing::debug!(server_id = self.log.server_id(), error = %err, "stdio read failed");
                    return Frame::End;
                }
            };
            let newline = available.iter().position(|&b| b == b'\n');
            let take = newline.map_or(available.len(), |at| at + 1);
            let chunk = &available[..take];
            let ended = newline.is_some();
            let content = self.line.len() + take - usize::from(ended);
            if let Some(oversized) = self.oversized.as_mut() {
                oversized.scan.feed(chunk);
                oversized.bytes += take;
            } else if content > self.max_bytes {
                let mut scan = TopLevelScan::of(&self.line);
                scan.feed(chunk);
                self.oversized = Some(Oversized {
                    scan,
                    bytes: self.line.len() + take,
                });
                self.clear_line();
            } else {
                self.line.extend_from_slice(chunk);
            }
            self.read.consume(take);
            if ended {
                return match self.oversized.take() {
                    Some(oversized) => Frame::Oversized(oversized),
                    None => Frame::Line,
                };
            }
        }
    }

    fn clear_line(&mut self) {
        self.line.clear();
        if self.line.capacity() > KEEP_BUFFER {
            self.line = Vec::new();
        }
    }

    /// The next message for rmcp: a server message, or the error standing in
    /// for an answer that could not be taken; `None` at the end of the stream.
    async fn next_message(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            let refused = match self.next_frame().await {
                Frame::End => return None,
                Frame::Oversized(oversized) => (oversized.scan, Refusal::TooLarge(oversized.bytes)),
                Frame::Line => {
                    let line = message_bytes(&self.line);
                    if line.is_empty() {
                        self.clear_line();
                        continue;
                    }
                    match serde_json::from_slice(line) {
                        Ok(message) => {
                            self.clear_line();
                            return Some(message);
                        }
                        Err(err) => {
                            let scan = TopLevelScan::of(line);
                            self.clear_line();
                            (scan, Refusal::Unparsable(err))
                        }
                    }
                }
            };
            if let Some(error) = self.refuse(&refused.0, refused.1) {
                return Some(error);
            }
        }
    }

    /// The error answering the request a refused line answered, or `None`
    /// when the line answered no request of ours (it is dropped).
    fn refuse(
        &self,
        scan: &TopLevelScan,
        refusal: Refusal,
    ) -> Option<RxJsonRpcMessage<RoleClient>> {
        let server_id = self.log.server_id();
        let (reason, message) = match &refusal {
            Refusal::TooLarge(bytes) => (
                DropReason::TooLarge,
                format!(
                    "the server sent a message of {bytes} bytes, over max_message_bytes = {}; it was dropped",
                    self.max_bytes
                ),
            ),
            Refusal::Unparsable(err) => (
                DropReason::Unparsable,
                format!("the server sent a message that cannot be parsed: {err}"),
            ),
        };
        metrics::counter!("mcp_messages_dropped_total", "server_id" => server_id.to_owned(), "reason" => reason.as_str())
            .increment(1);
        let id = scan.id().filter(|_| !scan.has_method());
        match (&refusal, &id) {
            // Notifications of methods rmcp does not know fail to parse
            // too; rmcp ignores those, and so does this reader.
            (Refusal::Unparsable(_), None) => {
                if let Some(suppressed) = self.log.events().admit(IGNORED_MESSAGE) {
                    tracing::debug!(server_id, suppressed, error = %message, "ignoring a server message");
                }
            }
            _ => {
                if let Some(suppressed) = self.log.events().admit("dropped_message") {
                    tracing::warn!(server_id, suppressed, answers_request = id.is_some(), error = %message, "dropped a server message");
                }
            }
        }
        Some(RxJsonRpcMessage::<RoleClient>::error(
            reason.error(message),
            Some(id?),
        ))
    }
}

/// The JSON of a line: without its line ending or a byte order mark.
fn message_bytes(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use crate::dropped::dropped_answer;
    use crate::error::McpError;

    use rmcp::ServiceExt as _;
    use rmcp::model::{ClientCapabilities, ClientConfig, Implementation};
    use serde_json::{Value, json};
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};

    use super::*;

    const MAX: usize = 64 * 1024;

    /// A raw JSON-RPC server on the other end of in-memory pipes: answers
    /// `initialize`, and every other request with `answer(method, id)`
    /// (lines written as given).
    fn raw_server(
        answer: impl Fn(&str, &Value) -> Vec<String> + Send + 'static,
    ) -> StdioTransport<tokio::io::DuplexStream, tokio::io::DuplexStream> {
        raw_server_logging_to(&ServerLog::new("raw"), answer)
    }

    /// [`raw_server`], its events going to `log`.
    fn raw_server_logging_to(
        log: &ServerLog,
        answer: impl Fn(&str, &Value) -> Vec<String> + Send + 'static,
    ) -> StdioTransport<tokio::io::DuplexStream, tokio::io::DuplexStream> {
        let (client_read, mut server_write) = tokio::io::duplex(1 << 16);
        let (server_read, client_write) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            let mut lines = BufReader::new(server_read).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let message: Value = serde_json::from_str(&line).unwrap();
                let (Some(id), Some(method)) = (message.get("id"), message["method"].as_str())
                else {
                    continue;
                };
                let out = if method == "initialize" {
                    vec![
                        json!({"jsonrpc": "2.0", "id": id, "result": {
                            "protocolVersion": message["params"]["protocolVersion"],
                            "capabilities": {"tools": {}},
                            "serverInfo": {"name": "raw", "version": "0"},
                        }})
                        .to_string(),
                    ]
                } else {
                    answer(method, id)
                };
                for line in out {
                    if server_write
                        .write_all(format!("{line}\n").as_bytes())
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        });
        StdioTransport::new(client_read, client_write, MAX, log)
    }

    async fn client(
        transport: StdioTransport<tokio::io::DuplexStream, tokio::io::DuplexStream>,
    ) -> rmcp::service::RunningService<RoleClient, ClientConfig> {
        let info = ClientConfig::new(ClientCapabilities::default(), Implementation::new("t", "0"));
        tokio::time::timeout(Duration::from_secs(5), info.serve(transport))
            .await
            .expect("initialize in time")
            .expect("initialize")
    }

    fn mapped(err: rmcp::service::ServiceError) -> McpError {
        match err {
            rmcp::service::ServiceError::McpError(error) => {
                dropped_answer(&error).unwrap_or_else(|| panic!("not a dropped answer: {error:?}"))
            }
            other => panic!("unexpected error {other:?}"),
        }
    }

    #[tokio::test]
    async fn an_oversized_answer_fails_its_request_at_once() {
        let transport = raw_server(|method, id| match method {
            // The id after the payload, and a notification over the limit first.
            "tools/list" => vec![
                format!(
                    r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"level":"info","data":"{}"}}}}"#,
                    "n".repeat(MAX * 3)
                ),
                format!(
                    r#"{{"jsonrpc":"2.0","result":{{"tools":[{{"name":"{}","inputSchema":{{}}}}]}},"id":{id}}}"#,
                    "x".repeat(MAX * 4)
                ),
            ],
            _ => vec![json!({"jsonrpc": "2.0", "id": id, "result": {}}).to_string()],
        });
        let service = client(transport).await;
        let started = Instant::now();
        let err = tokio::time::timeout(Duration::from_secs(5), service.peer().list_tools(None))
            .await
            .expect("the request fails at once, not at a timeout")
            .unwrap_err();
        let err = mapped(err);
        assert!(matches!(err, McpError::OutputTooLarge(_)), "{err:?}");
        let message = err.to_string();
        assert!(
            message.contains(&format!("max_message_bytes = {MAX}")),
            "{message}"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
        // The connection stays usable.
        let pong = tokio::time::timeout(
            Duration::from_secs(5),
            service
                .peer()
                .send_request(rmcp::model::ClientRequest::PingRequest(
                    rmcp::model::PingRequest::default(),
                )),
        )
        .await
        .expect("ping in time");
        assert!(pong.is_ok(), "{pong:?}");
    }

    #[tokio::test]
    async fn an_answer_nested_too_deep_fails_its_request_at_once() {
        let transport = raw_server(|_, id| {
            let deep = format!("{}{{}}{}", "{\"x\":".repeat(300), "}".repeat(300));
            vec![format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"tools":[{{"name":"deep","inputSchema":{deep}}}]}}}}"#
            )]
        });
        let service = client(transport).await;
        let err = tokio::time::timeout(Duration::from_secs(5), service.peer().list_tools(None))
            .await
            .expect("the request fails at once")
            .unwrap_err();
        let err = mapped(err);
        assert!(matches!(err, McpError::Protocol(_)), "{err:?}");
        assert!(err.to_string().contains("recursion limit"), "{err}");
    }

    #[tokio::test]
    async fn garbage_lines_answering_nothing_are_logged_within_the_rate_limit() {
        const GARBAGE: usize = 100;
        let log = ServerLog::new("garbage");
        let transport = raw_server_logging_to(&log, |_, id| {
            let mut lines = vec!["not json, no id".to_owned(); GARBAGE];
            lines.push(json!({"jsonrpc": "2.0", "id": id, "result": {}}).to_string());
            lines
        });
        let service = client(transport).await;
        let pong = tokio::time::timeout(
            Duration::from_secs(5),
            service
                .peer()
                .send_request(rmcp::model::ClientRequest::PingRequest(
                    rmcp::model::PingRequest::default(),
                )),
        )
        .await
        .expect("ping in time");
        assert!(pong.is_ok(), "{pong:?}");
        // Read in order: every garbage line was taken before the answer, and
        // they used up the burst of the event's rate limit.
        assert_eq!(log.events().admit(IGNORED_MESSAGE), None);
    }
}
