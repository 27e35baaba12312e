//! The REST admin API under `/admin/api` (docs/reference.md §5, §15): the
//! router, the extractors, the framework's refusals as JSON, and the
//! handlers, one module per resource:
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
//! - `audit`: `GET /audit`.
//!
//! The routes of approvals, access, OAuth connections, usage and
//! `server.json` import live with their domain modules and are merged in
//! [`router()`], under the same body limit and refusals.
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

mod apply;
mod audit;
mod error;
mod extract;
mod import;
mod limits;
mod rescan;
mod revision;
mod router;
mod servers;
mod tool_preview;
mod whoami;
mod workers;

pub use extract::ACTOR_HEADER;
pub(crate) use extract::{
    Caller, Params, RequireAdmin, RequireApprovalReader, RequireApprover, RequireEditor,
    RequireViewer, http_identity,
};
pub use limits::MAX_BODY_BYTES;
pub(crate) use revision::{expected_revision, with_etag};
pub use router::router;
