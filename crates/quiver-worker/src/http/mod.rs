//! The worker's HTTP edge: the router, the extractors (caller, request id,
//! session id, body and query with JSON refusals), the one error response,
//! and the handlers, one module per resource:
//!
//! - [`tools`]: `GET /v1/mcp/tools`, `POST /v1/mcp/tools/call` (the direct
//!   tool API, docs/reference.md §15);
//! - [`chat`]: `POST /v1/chat/completions` (§9);
//! - [`servers`]: `GET /v1/mcp/servers` (per-server health);
//! - [`artifacts`]: `GET /v1/artifacts/{id}` (images and audio of results, §13.2);
//! - [`mcp`]: `/mcp`, `/mcp/{server_id}` (gateway mode, §13.4);
//! - [`sessions`]: `DELETE /v1/sessions/{session_id}` (per-session connections, §13.1);
//! - [`ops`]: `/healthz`, `/readyz`, `/metrics`.
//!
//! Every refusal, the framework's included (unknown route, wrong method,
//! body over [`MAX_REQUEST_BODY_BYTES`], a bad query string), is the JSON
//! error object of [`crate::error::ErrorObject`] with the status of its
//! [`quiver_model::ErrorCode`]. Handlers take the edge's [`extract`] types,
//! never axum's `Query`/`Json`/`Bytes`, whose refusals are plain text.
//!
//! Modules depend one way: handlers → `extract`, `error`, `state`;
//! `router` → handlers; nothing imports this module's root.
//!
//! The domain modules (`call`, `catalog`, `chat`) know nothing of HTTP: a
//! new endpoint is a handler module here plus a route in [`router()`]; a new
//! failure is a row of the `ErrorCode` table and a `From` into
//! [`ErrorObject`](crate::error::ErrorObject).

pub mod artifacts;
pub mod chat;
pub mod error;
pub mod extract;
mod fallback;
pub mod grants;
pub mod mcp;
pub mod ops;
mod router;
pub mod servers;
pub mod sessions;
mod state;
pub mod tools;
pub mod whoami;

pub use crate::limits::MAX_REQUEST_BODY_BYTES;
pub use error::ApiError;
pub use router::router;
pub use state::ApiState;
