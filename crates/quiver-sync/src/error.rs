//! The one error type of the crate.

use std::time::Duration;

/// Why the sync could not be built, or why one attempt to follow the
/// registry failed. Attempts are retried; [`crate::SnapshotHandle::last_error`]
/// shows the most recent failure.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SyncError {
    /// The options cannot work.
    #[error("invalid sync options: {0}")]
    InvalidOptions(String),
    /// A registry call failed (transport error or an error status).
    #[error("registry {call} failed ({code:?}): {message}")]
    Rpc {
        /// The call, e.g. `list`.
        call: &'static str,
        /// The gRPC status code.
        code: tonic::Code,
        /// The status message.
        message: String,
    },
    /// A registry call did not answer in time.
    #[error("registry {call} did not answer within {after:?}")]
    Timeout {
        /// The call, e.g. `get`.
        call: &'static str,
        /// The timeout that ran out.
        after: Duration,
    },
    /// The registry sent a record the worker cannot read; the last snapshot
    /// stays in use rather than a snapshot with that record silently missing.
    #[error("registry sent an unreadable record {server_id:?}: {source}")]
    Conversion {
        /// The record, as far as it is known.
        server_id: String,
        /// What is wrong with it.
        source: quiver_proto::ConversionError,
    },
    /// No event and no heartbeat arrived on the watch stream for too long.
    #[error("watch stream silent for {0:?}; assuming it is dead")]
    StreamIdle(Duration),
    /// The registry closed the watch stream.
    #[error("watch stream ended")]
    StreamEnded,
    /// The watch stream skipped a revision (the registry promises it never
    /// does, so the follower cannot trust its incremental state).
    #[error("watch stream jumped from revision {after} to {got}")]
    RevisionGap {
        /// The last revision applied.
        after: u64,
        /// The revision received.
        got: u64,
    },
}

impl SyncError {
    pub(crate) fn rpc(call: &'static str, status: &tonic::Status) -> Self {
        SyncError::Rpc {
            call,
            code: status.code(),
            message: status.message().to_owned(),
        }
    }

    /// The registry's refusal for a limit (`RESOURCE_EXHAUSTED`, e.g. a
    /// caller's pending approvals at their cap): its message, naming it.
    pub fn limit_message(&self) -> Option<&str> {
        match self {
            SyncError::Rpc {
                code: tonic::Code::ResourceExhausted,
                message,
                ..
            } => Some(message),
            _ => None,
        }
    }

    /// The gRPC status code, when the registry answered with one.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            SyncError::Rpc { code, .. } => Some(*code),
            _ => None,
        }
    }
}
