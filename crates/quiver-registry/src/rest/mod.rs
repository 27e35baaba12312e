//! The registry's HTTP edge: the REST admin API under `/admin/api`
//! (docs/reference.md §5, §15) — the router, the extractors, the
//! framework's refusals as JSON, and the handlers, one module per
//! resource — and the browser's OAuth and sign-in pages beside it:
//!
//! - `whoami`: `GET /whoami` (who the credential is; the web admin signs
//!   in with it);
//! - `servers`: `/mcp/servers`, `/mcp/servers/{id}`, its `history` and
//!   `rollback`;
//! - `import`: `POST /mcp/import` (an uploaded `mcp.d` file);
//! - `apply`: `POST /servers/apply` (many records in one transaction);
//! - `rescan`: `POST /mcp/rescan` (`mcp.d` and `policies.d`);
//! - `tool_preview`: `POST /mcp/preview`, `POST /mcp/evaluate`;
//! - `workers`: `GET /workers`;
//! - `record_defaults`: `GET /record-defaults` (the record's defaults);
//! - `audit`: `GET /audit` (the trail is [`crate::audit`]'s);
//! - `approvals`: `/approvals`, `/approvals/{id}` (deciding them);
//! - `access`: `/policies`, `/keys`, `/identity/providers`,
//!   `POST /access/explain`;
//! - `oauth`: `/oauth/connections…`, and the browser's OAuth pages outside
//!   `/admin/api` ([`oauth_pages`]);
//! - `usage`: `GET /usage`;
//! - `server_json`: `POST /import/server-json`;
//! - `signin`: the web admin's sign-in pages outside `/admin/api`
//!   ([`signin_pages`]).
//!
//! Each handler module calls its domain module (`approvals`, `access`,
//! `oauth`, `usage`, `audit`, …), which knows nothing of HTTP and never
//! imports this one.
//!
//! Bodies use the `mcp.d` field names. Record bodies are parsed strictly
//! (unknown fields are errors) so typos never silently vanish. Errors are JSON
//! `{"error": {"code", "message", "field"?}}` with a fitting status; reads made
//! with the viewer or editor token mask literal env and header values, and so
//! do reads with `?masked=true` (the web admin never holds secrets).
//!
//! Who may call a route is the extractor its handler takes (`RequireEditor`,
//! `RequireReader`, …; docs/reference.md §5), never the request's path.
//!
//! Masked values stay masked unless changed: a record written back (upsert,
//! import) or previewed with an env/header value (or a URL secret) that is
//! exactly the mask keeps the stored value of that key
//! ([`RegistryState::upsert_keeping_masked`](crate::state::RegistryState::upsert_keeping_masked)).
//!
//! Refusals by the framework itself — a body over [`MAX_BODY_BYTES`], an
//! unknown route, a method a route does not have — are the same JSON error
//! object (`error::json_refusals`); query strings are parsed here (`Params`),
//! so a repeated or undecodable parameter is an error naming it.
//!
//! A server's stderr (which may show secrets it printed) reaches the API in
//! workers' `last_error`s and in preview errors: it is shown to the admin
//! token only, and every text that may quote a record has the record's
//! secrets redacted ([`McpServerSpec::redact`](quiver_model::McpServerSpec::redact)).
//!
//! Modules depend one way: handlers → `extract`, `revision`; `router` →
//! handlers, `error`, `limits`. The root only re-exports what the rest of
//! the crate uses.

mod access;
mod apply;
mod approvals;
mod audit;
mod error;
mod extract;
mod import;
mod limits;
mod oauth;
mod record_defaults;
mod rescan;
mod revision;
mod router;
mod server_json;
mod servers;
mod signin;
mod tool_preview;
mod usage;
mod whoami;
mod workers;

pub use extract::ACTOR_HEADER;
pub(crate) use extract::{Params, http_identity};
pub use limits::MAX_BODY_BYTES;
pub use oauth::oauth_pages;
pub use router::router;
pub use signin::signin_pages;
