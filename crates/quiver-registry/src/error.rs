//! Registry errors and the one table mapping them to gRPC codes and HTTP
//! statuses, so the two APIs never disagree about the same failure.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use quiver_mcp::probe::{ProbeError, ProbeStep};
use quiver_model::ErrorCode as SharedCode;
use quiver_model::ModelError;
use quiver_store::StoreError;
use serde_json::json;

/// Everything a registry request can fail with.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// No or unknown credential.
    #[error("missing or invalid bearer token")]
    Unauthenticated,
    /// A valid credential without the needed role.
    #[error("{0}")]
    PermissionDenied(String),
    /// The record (or history entry) does not exist.
    #[error("{0}")]
    NotFound(String),
    /// `expected_revision` did not match.
    #[error(
        "revision conflict on {server_id:?}: expected revision {expected}, current revision {current}"
    )]
    Conflict {
        /// The record.
        server_id: String,
        /// What the caller expected.
        expected: u64,
        /// What is stored (0: absent).
        current: u64,
    },
    /// Malformed input; `field` names the offending field when there is one.
    #[error("{message}")]
    InvalidArgument {
        /// Dotted path of the field.
        field: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// The request cannot be served in the current state (watch outside the
    /// change log, rescan without an `mcp.d` or `policies.d` directory, a
    /// policy still named by keys or rules).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The registry is shutting down or its database is unreachable.
    #[error("{0}")]
    Unavailable(String),
    /// An MCP server the registry connected to itself (tool preview) could
    /// not be started, reached or initialized, or failed `tools/list`.
    #[error("{message}")]
    McpUnavailable {
        /// What went wrong.
        message: String,
        /// The last lines the stdio child wrote to stderr.
        stderr_tail: Vec<String>,
    },
    /// The registry's egress allowlist refuses the URL of a record it was
    /// asked to connect to (tool preview); nothing was connected.
    #[error("{0}")]
    McpPolicyDenied(String),
    /// An MCP server the registry connected to itself did not answer in time.
    #[error("{message}")]
    McpTimeout {
        /// Which step ran out of time.
        message: String,
        /// The last lines the stdio child wrote to stderr.
        stderr_tail: Vec<String>,
    },
    /// A bound of the registry was reached (e.g. `max_workers`); the
    /// message names it.
    #[error("{0}")]
    ResourceExhausted(String),
    /// A request body over the size limit; the message names it.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// An API route that exists, with another method.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// An approval decided, used or expired already: it can no longer be
    /// decided (docs/reference.md §13.7).
    #[error("{0}")]
    ApprovalNotPending(String),
    /// A bug or corrupt data.
    #[error("{0}")]
    Internal(String),
    /// The record at `index` of a batch (`ApplyMcpServers`, `POST
    /// /admin/api/servers/apply`) failed, so nothing of the batch was
    /// written. Invalid records are named by their field instead
    /// (`servers[i].field`, see [`RegistryError::in_record`]).
    #[error("servers[{index}]: {error}")]
    InRecord {
        /// Position of the record in the batch (0-based).
        index: usize,
        /// Why it failed.
        error: Box<RegistryError>,
    },
}

/// Stable machine-readable error codes of the REST API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// See [`RegistryError::Unauthenticated`].
    Unauthenticated,
    /// See [`RegistryError::PermissionDenied`].
    PermissionDenied,
    /// See [`RegistryError::NotFound`].
    NotFound,
    /// See [`RegistryError::Conflict`].
    Conflict,
    /// See [`RegistryError::InvalidArgument`].
    InvalidArgument,
    /// See [`RegistryError::FailedPrecondition`].
    FailedPrecondition,
    /// See [`RegistryError::Unavailable`].
    Unavailable,
    /// See [`RegistryError::McpUnavailable`]; the §10 code of the same failure
    /// on a worker.
    McpUnavailable,
    /// See [`RegistryError::McpTimeout`]; the §10 code of the same failure on
    /// a worker.
    McpTimeout,
    /// See [`RegistryError::McpPolicyDenied`]; a worker's code and status
    /// for the same refusal.
    McpPolicyDenied,
    /// See [`RegistryError::ResourceExhausted`].
    ResourceExhausted,
    /// See [`RegistryError::PayloadTooLarge`].
    PayloadTooLarge,
    /// See [`RegistryError::MethodNotAllowed`].
    MethodNotAllowed,
    /// See [`RegistryError::ApprovalNotPending`].
    ApprovalNotPending,
    /// See [`RegistryError::Internal`].
    Internal,
}

impl ErrorCode {
    /// The code as it appears in JSON error bodies.
    pub fn as_str(self) -> &'static str {
        self.mapping().0
    }

    /// The gRPC status code.
    pub fn grpc(self) -> tonic::Code {
        self.mapping().1
    }

    /// The HTTP status.
    pub fn http(self) -> StatusCode {
        self.mapping().2
    }

    /// The table itself. Codes a worker answers with too take their string
    /// from the shared table ([`SharedCode`]), so one string means one
    /// thing; their gRPC code and HTTP status are mapped here, once.
    fn mapping(self) -> (&'static str, tonic::Code, StatusCode) {
        match self {
            ErrorCode::Unauthenticated => (
                SharedCode::Unauthenticated.as_str(),
                tonic::Code::Unauthenticated,
                StatusCode::UNAUTHORIZED,
            ),
            ErrorCode::PermissionDenied => (
                "permission_denied",
                tonic::Code::PermissionDenied,
                StatusCode::FORBIDDEN,
            ),
            ErrorCode::NotFound => (
                SharedCode::NotFound.as_str(),
                tonic::Code::NotFound,
                StatusCode::NOT_FOUND,
            ),
            ErrorCode::Conflict => ("conflict", tonic::Code::Aborted, StatusCode::CONFLICT),
            ErrorCode::InvalidArgument => (
                "invalid_argument",
                tonic::Code::InvalidArgument,
                StatusCode::BAD_REQUEST,
            ),
            ErrorCode::FailedPrecondition => (
                "failed_precondition",
                tonic::Code::FailedPrecondition,
                StatusCode::PRECONDITION_FAILED,
            ),
            ErrorCode::Unavailable => (
                "unavailable",
                tonic::Code::Unavailable,
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            // The registry is the gateway to the MCP server here, so the
            // upstream's failure is a 502/504, not the registry's own 503.
            ErrorCode::McpUnavailable => (
                SharedCode::McpUnavailable.as_str(),
                tonic::Code::Unavailable,
                StatusCode::BAD_GATEWAY,
            ),
            ErrorCode::McpTimeout => (
                SharedCode::McpTimeout.as_str(),
                tonic::Code::DeadlineExceeded,
                StatusCode::GATEWAY_TIMEOUT,
            ),
            // A worker answers the same refusal with the same 403.
            ErrorCode::McpPolicyDenied => (
                SharedCode::McpPolicyDenied.as_str(),
                tonic::Code::PermissionDenied,
                StatusCode::FORBIDDEN,
            ),
            ErrorCode::ResourceExhausted => (
                SharedCode::ResourceExhausted.as_str(),
                tonic::Code::ResourceExhausted,
                StatusCode::TOO_MANY_REQUESTS,
            ),
            ErrorCode::PayloadTooLarge => (
                SharedCode::PayloadTooLarge.as_str(),
                tonic::Code::ResourceExhausted,
                StatusCode::PAYLOAD_TOO_LARGE,
            ),
            ErrorCode::MethodNotAllowed => (
                SharedCode::MethodNotAllowed.as_str(),
                tonic::Code::Unimplemented,
                StatusCode::METHOD_NOT_ALLOWED,
            ),
            ErrorCode::ApprovalNotPending => (
                "approval_not_pending",
                tonic::Code::FailedPrecondition,
                StatusCode::CONFLICT,
            ),
            ErrorCode::Internal => (
                SharedCode::Internal.as_str(),
                tonic::Code::Internal,
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
        }
    }
}

impl RegistryError {
    /// The error's code.
    pub fn code(&self) -> ErrorCode {
        match self {
            RegistryError::Unauthenticated => ErrorCode::Unauthenticated,
            RegistryError::PermissionDenied(_) => ErrorCode::PermissionDenied,
            RegistryError::NotFound(_) => ErrorCode::NotFound,
            RegistryError::Conflict { .. } => ErrorCode::Conflict,
            RegistryError::InvalidArgument { .. } => ErrorCode::InvalidArgument,
            RegistryError::FailedPrecondition(_) => ErrorCode::FailedPrecondition,
            RegistryError::Unavailable(_) => ErrorCode::Unavailable,
            RegistryError::McpUnavailable { .. } => ErrorCode::McpUnavailable,
            RegistryError::McpTimeout { .. } => ErrorCode::McpTimeout,
            RegistryError::McpPolicyDenied(_) => ErrorCode::McpPolicyDenied,
            RegistryError::ResourceExhausted(_) => ErrorCode::ResourceExhausted,
            RegistryError::PayloadTooLarge(_) => ErrorCode::PayloadTooLarge,
            RegistryError::MethodNotAllowed(_) => ErrorCode::MethodNotAllowed,
            RegistryError::ApprovalNotPending(_) => ErrorCode::ApprovalNotPending,
            RegistryError::Internal(_) => ErrorCode::Internal,
            RegistryError::InRecord { error, .. } => error.code(),
        }
    }

    /// The stderr tail an MCP connection error carries.
    pub fn stderr_tail(&self) -> Option<&[String]> {
        match self {
            RegistryError::McpUnavailable { stderr_tail, .. }
            | RegistryError::McpTimeout { stderr_tail, .. } => Some(stderr_tail),
            RegistryError::InRecord { error, .. } => error.stderr_tail(),
            _ => None,
        }
    }

    /// The field an invalid-argument error names.
    pub fn field(&self) -> Option<&str> {
        match self {
            RegistryError::InvalidArgument { field, .. } => field.as_deref(),
            _ => None,
        }
    }

    /// This error as the failure of the `index`-th record of a batch: an
    /// invalid argument names the field as `servers[i].field` (like the
    /// parser names fields of multi-record documents), anything else is
    /// wrapped in [`RegistryError::InRecord`].
    pub fn in_record(self, index: usize) -> Self {
        match self {
            RegistryError::InvalidArgument { field, message } => RegistryError::InvalidArgument {
                field: Some(match field {
                    Some(field) if !field.is_empty() => format!("servers[{index}].{field}"),
                    _ => format!("servers[{index}]"),
                }),
                message,
            },
            other => RegistryError::InRecord {
                index,
                error: Box::new(other),
            },
        }
    }

    /// An invalid-argument error about `field`.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        RegistryError::InvalidArgument {
            field: Some(field.into()),
            message: message.into(),
        }
    }
}

/// Parses a JSON request body; errors name the field (`rules[1].claim`).
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, RegistryError> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
        let path = err.path().to_string();
        let field = if path == "." { None } else { Some(path) };
        RegistryError::InvalidArgument {
            field,
            message: err.inner().to_string(),
        }
    })
}

impl From<ModelError> for RegistryError {
    fn from(err: ModelError) -> Self {
        RegistryError::InvalidArgument {
            field: err.field().map(str::to_owned),
            message: err.to_string(),
        }
    }
}

impl From<quiver_proto::ConversionError> for RegistryError {
    fn from(err: quiver_proto::ConversionError) -> Self {
        RegistryError::InvalidArgument {
            field: Some(err.field().to_owned()),
            message: err.to_string(),
        }
    }
}

impl From<ProbeError> for RegistryError {
    fn from(err: ProbeError) -> Self {
        let mut message = err.to_string();
        if let ProbeError::Unavailable {
            step: ProbeStep::Launch,
            ..
        } = &err
        {
            message.push_str(
                " (a preview resolves ${ENV:...} references in the registry's environment, not a worker's)",
            );
        }
        match err {
            ProbeError::Unavailable { stderr_tail, .. } => RegistryError::McpUnavailable {
                message,
                stderr_tail,
            },
            ProbeError::Timeout { stderr_tail, .. } => RegistryError::McpTimeout {
                message,
                stderr_tail,
            },
            ProbeError::PolicyDenied { .. } => RegistryError::McpPolicyDenied(message),
        }
    }
}

impl From<StoreError> for RegistryError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::NotFound(id) => {
                RegistryError::NotFound(format!("mcp server {id:?} not found"))
            }
            StoreError::Conflict {
                server_id,
                expected,
                current,
            } => RegistryError::Conflict {
                server_id,
                expected,
                current,
            },
            StoreError::Invalid(err) => err.into(),
            StoreError::MissingReference { ref field, .. } => RegistryError::InvalidArgument {
                field: Some(field.clone()),
                message: err.to_string(),
            },
            StoreError::InUse { .. } => RegistryError::FailedPrecondition(err.to_string()),
            StoreError::AccessNotFound { .. } => RegistryError::NotFound(err.to_string()),
            StoreError::InRecord { index, source } => RegistryError::from(*source).in_record(index),
            StoreError::Limit(message) => RegistryError::ResourceExhausted(message),
            StoreError::Database(err) => {
                tracing::error!(error = %err, "database error");
                RegistryError::Unavailable(format!("database unavailable: {err}"))
            }
            other => {
                tracing::error!(error = %other, "store error");
                RegistryError::Internal(other.to_string())
            }
        }
    }
}

impl From<RegistryError> for tonic::Status {
    fn from(err: RegistryError) -> Self {
        metrics::counter!("quiver_registry_errors_total", "code" => err.code().as_str())
            .increment(1);
        let message = match err.field() {
            Some(field) if !err.to_string().starts_with(field) => format!("{field}: {err}"),
            _ => err.to_string(),
        };
        tonic::Status::new(err.code().grpc(), message)
    }
}

impl IntoResponse for RegistryError {
    fn into_response(self) -> Response {
        metrics::counter!("quiver_registry_errors_total", "code" => self.code().as_str())
            .increment(1);
        let code = self.code();
        let mut body = json!({"error": {"code": code.as_str(), "message": self.to_string()}});
        if let Some(field) = self.field() {
            body["error"]["field"] = json!(field);
        }
        let (index, inner) = match &self {
            RegistryError::InRecord { index, error } => (Some(*index), error.as_ref()),
            other => (None, other),
        };
        if let Some(index) = index {
            body["error"]["index"] = json!(index);
        }
        if let RegistryError::Conflict { current, .. } = inner {
            body["error"]["current_revision"] = json!(current);
        }
        if let Some(tail) = self.stderr_tail() {
            body["error"]["stderr_tail"] = json!(tail);
        }
        let mut response = (code.http(), axum::Json(body)).into_response();
        if code == ErrorCode::Unauthenticated {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}
