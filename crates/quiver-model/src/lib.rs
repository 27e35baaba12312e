//! The Quiver domain model: the MCP server record (docs/reference.md §1), its validation,
//! its TOML/JSON forms, tool-name patterns, injected tool names and the
//! layered tool policy, `${ENV:…}` references and the registry's revision and
//! history types, and the one table of error codes every API answers with
//! ([`ErrorCode`]). Every other crate speaks these types.

pub mod access;
pub mod approval;
pub mod budget;
pub mod env_ref;
mod error;
mod error_code;
mod mask;
pub mod naming;
mod parse;
pub mod pattern;
pub mod policy;
pub mod rate_limit;
mod record;
pub mod resource_uri;
pub mod server_json;
mod source;
mod stored;
pub mod token;
pub mod tool_search;
pub mod usage;
mod validate;

pub use error::{FieldError, Format, ModelError};
pub use error_code::ErrorCode;
pub use mask::{MASK, is_secret_parameter, redact_url, redact_urls};
pub use parse::{
    ParsedRecord, Strictness, kind_of, parse_document, parse_record, parse_record_value,
    parse_value, render_ignored,
};
pub use record::{
    ApprovalMode, ApprovalPolicy, Budgets, HttpConfig, Isolation, McpServerSpec, PrefixOp,
    PrefixReplace, Protocol, StdioConfig, TransformStep, Transport,
};
pub use source::{Source, UnknownSource};
pub use stored::{Change, ChangeKind, HistoryEntry, StoredServer};
pub use validate::{is_valid_credential_name, is_valid_server_id, validate};
