//! How a request to the upstream can fail, and what the caller of the
//! worker is told.

use std::time::Duration;

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::HeaderValue;

/// A failed upstream request.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The upstream refused the request (a 4xx other than 429). Never
    /// retried; the caller gets the provider's status and message.
    #[error("upstream rejected the request with status {status}")]
    Rejected {
        /// The provider's status.
        status: StatusCode,
        /// The provider's body (usually `{"error": {"message": …}}`).
        body: Bytes,
        /// The provider's `Content-Type`.
        content_type: Option<HeaderValue>,
    },
    /// The upstream kept answering 429 or 5xx until the retries ran out, or
    /// asked for a longer pause (`Retry-After`) than the worker waits.
    #[error("upstream answered {status} after {attempts} attempt(s)")]
    Failed {
        /// The last status.
        status: StatusCode,
        /// The last body.
        body: Bytes,
        /// The last `Content-Type`.
        content_type: Option<HeaderValue>,
        /// Requests made.
        attempts: u32,
    },
    /// The upstream could not be reached (connect, reset, broken body) after
    /// the retries ran out.
    #[error("upstream unreachable after {attempts} attempt(s): {message}")]
    Unreachable {
        /// The last network error.
        message: String,
        /// Requests made.
        attempts: u32,
    },
    /// No (complete) answer within the request timeout, after retries.
    #[error("upstream did not answer within {after:?} ({attempts} attempt(s))")]
    Timeout {
        /// The timeout of one attempt.
        after: Duration,
        /// Requests made.
        attempts: u32,
    },
    /// A success status with a body that is not a chat completion.
    #[error("upstream answered with an invalid chat completion: {0}")]
    InvalidResponse(String),
    /// A streamed answer broke off or carried an invalid chunk; streams are
    /// not retried once events have been read.
    #[error("upstream stream failed: {0}")]
    Stream(String),
}

impl UpstreamError {
    /// The status the worker answers its caller with.
    pub fn http_status(&self) -> StatusCode {
        match self {
            UpstreamError::Rejected { status, .. } | UpstreamError::Failed { status, .. } => {
                *status
            }
            UpstreamError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            UpstreamError::Unreachable { .. }
            | UpstreamError::InvalidResponse(_)
            | UpstreamError::Stream(_) => StatusCode::BAD_GATEWAY,
        }
    }

    /// The provider's own answer, when there is one to forward verbatim.
    pub fn provider_body(&self) -> Option<(&Bytes, Option<&HeaderValue>)> {
        match self {
            UpstreamError::Rejected {
                body, content_type, ..
            }
            | UpstreamError::Failed {
                body, content_type, ..
            } => Some((body, content_type.as_ref())),
            _ => None,
        }
    }
}
