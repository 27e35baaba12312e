//! How large a request the admin API reads.

/// Largest request body of the admin API (records, imports, previews).
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;
