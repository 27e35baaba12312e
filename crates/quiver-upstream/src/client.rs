//! The upstream client: one `POST {base_url}/chat/completions` per call,
//! retried on 429, 5xx and network errors with bounded, jittered exponential
//! backoff that honours `Retry-After`; other rejections are returned at once.

use std::time::{Duration, Instant, SystemTime};

use backon::{BackoffBuilder, ExponentialBuilder};
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde_json::Value;
use url::Url;

use crate::error::UpstreamError;
use crate::retry::{Verdict, requested_pause, verdict};

/// Largest streamed event accepted from the upstream (one chunk is small;
/// the bound only stops a misbehaving peer from exhausting memory).
const MAX_EVENT_BYTES: usize = 8 * 1024 * 1024;

/// Largest part of an error answer kept for the caller.
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// Where the upstream is and how hard to try.
#[derive(Debug, Clone)]
pub struct UpstreamOptions {
    /// Base URL of the OpenAI-compatible API, e.g. `https://api.openai.com/v1`;
    /// requests go to `<base_url>/chat/completions`.
    pub base_url: Url,
    /// Sent as `Authorization: Bearer <key>`; none for local providers.
    pub api_key: Option<String>,
    /// Time allowed to open a connection.
    pub connect_timeout: Duration,
    /// Time allowed for each wait of one attempt: the answer's headers, then
    /// its body (or each streamed event).
    pub request_timeout: Duration,
    /// Attempts after the first one for retryable failures.
    pub max_retries: u32,
    /// First backoff delay.
    pub backoff_min: Duration,
    /// Largest backoff delay.
    pub backoff_max: Duration,
    /// Longest `Retry-After` honoured; asking for more ends the retries.
    pub max_retry_after: Duration,
}

impl UpstreamOptions {
    /// Defaults for `base_url`: 3 retries, 250 ms to 8 s backoff, at most
    /// 60 s `Retry-After`, 10 s connect and 300 s request timeouts.
    pub fn new(base_url: Url) -> Self {
        UpstreamOptions {
            base_url,
            api_key: None,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(300),
            max_retries: 3,
            backoff_min: Duration::from_millis(250),
            backoff_max: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

/// Streamed `chat.completion.chunk` objects, ending after `[DONE]`.
pub type ChunkStream = BoxStream<'static, Result<Value, UpstreamError>>;

/// A shared upstream client (cheap to clone).
#[derive(Clone)]
pub struct Upstream {
    http: reqwest::Client,
    endpoint: Url,
    authorization: Option<HeaderValue>,
    options: UpstreamOptions,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("endpoint", &self.endpoint.as_str())
            .finish_non_exhaustive()
    }
}

/// Why an upstream client cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamConfigError {
    /// The base URL is not http(s).
    #[error("upstream url {0:?} must be an http:// or https:// url")]
    Scheme(String),
    /// The API key cannot be sent in a header.
    #[error("upstream api key contains characters not allowed in an http header")]
    ApiKey,
    /// The HTTP client could not be built (TLS set-up).
    #[error("upstream http client: {0}")]
    Client(#[source] reqwest::Error),
}

/// One attempt's failure, before the retry decision.
enum Attempt {
    Status(reqwest::Response),
    Network(String),
    Timeout,
}

impl Upstream {
    /// Builds the client.
    pub fn new(options: UpstreamOptions) -> Result<Self, UpstreamConfigError> {
        if !matches!(options.base_url.scheme(), "http" | "https") {
            return Err(UpstreamConfigError::Scheme(options.base_url.to_string()));
        }
        let mut endpoint = options.base_url.clone();
        // `join` would drop the last path segment of ".../v1".
        endpoint.set_path(&format!(
            "{}/chat/completions",
            endpoint.path().trim_end_matches('/')
        ));
        let authorization = options
            .api_key
            .as_deref()
            .map(|key| {
                let mut value = HeaderValue::from_str(&format!("Bearer {key}"))
                    .map_err(|_| UpstreamConfigError::ApiKey)?;
                value.set_sensitive(true);
                Ok(value)
            })
            .transpose()?;
        let http = reqwest::Client::builder()
            .connect_timeout(options.connect_timeout)
            .tcp_nodelay(true)
            .build()
            .map_err(UpstreamConfigError::Client)?;
        Ok(Upstream {
            http,
            endpoint,
            authorization,
            options,
        })
    }

    /// The URL requests are posted to.
    pub fn endpoint(&self) -> &Url {
        &self.endpoint
    }

    /// Sends a non-streaming request body and returns the parsed completion.
    pub async fn complete(&self, body: Bytes) -> Result<Value, UpstreamError> {
        let (response, attempts) = self.send(body, false).await?;
        let timeout = self.options.request_timeout;
        let bytes = match tokio::time::timeout(timeout, response.bytes()).await {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(err)) => {
                return Err(UpstreamError::Unreachable {
                    message: format!("reading the answer: {err}"),
                    attempts,
                });
            }
            Err(_) => {
                return Err(UpstreamError::Timeout {
                    after: timeout,
                    attempts,
                });
            }
        };
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(value @ Value::Object(_)) => Ok(value),
            Ok(_) => Err(UpstreamError::InvalidResponse(
                "the answer is not a JSON object".into(),
            )),
            Err(err) => Err(UpstreamError::InvalidResponse(format!(
                "the answer is not JSON: {err}"
            ))),
        }
    }

    /// Sends a streaming request body (`"stream": true`) and returns its
    /// chunks. Retries happen only until the upstream answers with a
    /// success status; a stream that breaks later is an error item.
    pub async fn stream(&self, body: Bytes) -> Result<ChunkStream, UpstreamError> {
        let (response, _) = self.send(body, true).await?;
        let idle = self.options.request_timeout;
        // The state is `None` once the stream ended or failed; an answer cut
        // off before `[DONE]` is an error, not a short answer.
        let chunks = futures::stream::unfold(Some(events_of(response)), move |events| async move {
            let mut events = events?;
            loop {
                let event = match tokio::time::timeout(idle, events.next()).await {
                    Err(_) => {
                        let err = UpstreamError::Stream(format!("no event for {idle:?}"));
                        return Some((Err(err), None));
                    }
                    Ok(None) => {
                        let err = UpstreamError::Stream("the stream ended before [DONE]".into());
                        return Some((Err(err), None));
                    }
                    Ok(Some(Err(err))) => {
                        return Some((Err(UpstreamError::Stream(err.to_string())), None));
                    }
                    Ok(Some(Ok(event))) => event,
                };
                // Comments and keep-alives carry no data.
                let Some(data) = event.data else { continue };
                if data.trim() == "[DONE]" {
                    return None;
                }
                return match serde_json::from_str::<Value>(&data) {
                    Ok(chunk) => Some((Ok(chunk), Some(events))),
                    Err(err) => {
                        let err = UpstreamError::Stream(format!("chunk is not JSON: {err}"));
                        Some((Err(err), None))
                    }
                };
            }
        });
        Ok(chunks.fuse().boxed())
    }

    /// Posts `body` until a success status, a rejection, or the end of the
    /// retry budget.
    async fn send(
        &self,
        body: Bytes,
        stream: bool,
    ) -> Result<(reqwest::Response, u32), UpstreamError> {
        let mut backoff = ExponentialBuilder::default()
            .with_min_delay(self.options.backoff_min)
            .with_max_delay(self.options.backoff_max)
            .with_jitter()
            .without_max_times()
            .build();
        let mut attempts = 0;
        loop {
            attempts += 1;
            let started = Instant::now();
            let outcome = self.attempt(body.clone(), stream).await;
            let status_label = match &outcome {
                Attempt::Status(response) => response.status().as_u16().to_string(),
                Attempt::Network(_) => "network".to_owned(),
                Attempt::Timeout => "timeout".to_owned(),
            };
            metrics::counter!("upstream_request_total", "status" => status_label).increment(1);
            metrics::histogram!("upstream_request_latency_ms")
                .record(started.elapsed().as_secs_f64() * 1000.0);
            let (error, pause) = match outcome {
                Attempt::Status(response) => match verdict(response.status()) {
                    Verdict::Success => return Ok((response, attempts)),
                    Verdict::Reject => {
                        let (status, body, content_type) =
                            provider_answer(response, self.options.request_timeout).await;
                        return Err(UpstreamError::Rejected {
                            status,
                            body,
                            content_type,
                        });
                    }
                    Verdict::Retry => {
                        let pause = requested_pause(response.headers(), SystemTime::now());
                        let (status, body, content_type) =
                            provider_answer(response, self.options.request_timeout).await;
                        let error = UpstreamError::Failed {
                            status,
                            body,
                            content_type,
                            attempts,
                        };
                        (error, pause)
                    }
                },
                Attempt::Network(message) => {
                    (UpstreamError::Unreachable { message, attempts }, None)
                }
                Attempt::Timeout => (
                    UpstreamError::Timeout {
                        after: self.options.request_timeout,
                        attempts,
                    },
                    None,
                ),
            };
            if attempts > self.options.max_retries {
                return Err(error);
            }
            let delay = match pause {
                Some(pause) if pause > self.options.max_retry_after => return Err(error),
                Some(pause) => pause,
                // backon's jitter adds up to 100 % on top of the delay:
                // keep the result within `backoff_max` as documented.
                None => backoff.next().map_or(self.options.backoff_max, |delay| {
                    delay.min(self.options.backoff_max)
                }),
            };
            tracing::warn!(attempt = attempts, delay_ms = delay.as_millis() as u64, error = %error, "upstream request failed; retrying");
            metrics::counter!("upstream_retry_total").increment(1);
            tokio::time::sleep(delay).await;
        }
    }

    async fn attempt(&self, body: Bytes, stream: bool) -> Attempt {
        let mut request = self
            .http
            .post(self.endpoint.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(
                ACCEPT,
                if stream {
                    "text/event-stream"
                } else {
                    "application/json"
                },
            )
            .body(body);
        if let Some(authorization) = &self.authorization {
            request = request.header(AUTHORIZATION, authorization.clone());
        }
        match tokio::time::timeout(self.options.request_timeout, request.send()).await {
            Err(_) => Attempt::Timeout,
            Ok(Err(err)) if err.is_timeout() => Attempt::Timeout,
            Ok(Err(err)) => Attempt::Network(error_chain(&err)),
            Ok(Ok(response)) => Attempt::Status(response),
        }
    }
}

fn events_of(response: reqwest::Response) -> quiver_sse::EventStream {
    quiver_sse::bounded_event_stream(response.bytes_stream(), MAX_EVENT_BYTES)
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// The provider's status, body and content type. A body that cannot be read
/// within `timeout` (a peer that stalls after the status) is left empty, as
/// one that breaks off is.
async fn provider_answer(
    response: reqwest::Response,
    timeout: Duration,
) -> (StatusCode, Bytes, Option<HeaderValue>) {
    let status = response.status();
    let content_type = response.headers().get(CONTENT_TYPE).cloned();
    let mut response = response;
    let mut body = Vec::new();
    // An error body is a message: keep its start, never wait or grow forever.
    let read = tokio::time::timeout(timeout, async {
        while let Ok(Some(chunk)) = response.chunk().await {
            let room = MAX_ERROR_BODY_BYTES - body.len();
            body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if body.len() == MAX_ERROR_BODY_BYTES {
                break;
            }
        }
    });
    let _ = read.await;
    (status, Bytes::from(body), content_type)
}
