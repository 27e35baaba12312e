//! Limits of the HTTP edge, in one place: the router applies them and the
//! error responses name them.

/// The largest request body the worker reads (tool calls, chat requests).
pub const MAX_REQUEST_BODY_BYTES: usize = 2 * 1024 * 1024;
