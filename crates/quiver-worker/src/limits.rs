//! Limits of what the worker reads from callers, in one place: the HTTP
//! edge applies and names them, and the gateway takes them as its defaults,
//! so they sit below both.

/// The largest request body the worker reads (tool calls, chat requests).
pub const MAX_REQUEST_BODY_BYTES: usize = 2 * 1024 * 1024;
