//! The OAuth credential broker (docs/reference.md §13.6): the registry holds
//! every OAuth connection's client registration and tokens (sealed, see
//! [`super::seal`]), runs the flows with rmcp's `auth` module, and hands
//! workers current access tokens, never refresh tokens.
//!
//! Flows:
//! - authorization code + PKCE: [`OAuthBroker::connect`] discovers the
//!   server's metadata, registers or names the client, and stores the
//!   pending flow (PKCE verifier sealed) in the database under its `state`;
//!   [`OAuthBroker::callback`] takes that row (one-time, whichever replica the
//!   browser comes back to) and exchanges the code;
//! - client credentials: [`OAuthBroker::connect`] asks for a token at once,
//!   and again whenever one is needed.
//!
//! A connection with `per_user` (R-OAUTH-8) keeps one grant per caller
//! principal instead: a principal without one gets a consent link
//! ([`Issued::Consent`]: absolute, single-use, bound to the principal and the
//! connection, expiring), whose first visit ([`OAuthBroker::follow_link`])
//! starts the authorization-code flow for that principal only; the callback
//! stores the grant under the principal. Each grant is sealed bound to its
//! connection and principal, refreshed under its own lease.
//!
//! Refresh happens on demand ([`OAuthBroker::access_token`]) under a lease
//! row in the database, so of all replicas exactly one refreshes a token;
//! the others wait for the lease and then find the new token. A refresh the
//! authorization server refuses (`invalid_grant`) marks the connection
//! `needs_reconsent`. Each step that fails says which step it was; a failed
//! flow stores nothing but the error message.
//!
//! One module a part: `connections` (the broker, sealing, settings),
//! `flow` (authorization code), `exchange` (the endpoints the flows share),
//! `tokens` (handing tokens out, refresh), `step_up`, `grants` (per-user
//! grants and consent links), with `step` and `audit` below them all.

mod audit;
mod connections;
mod exchange;
mod flow;
mod grants;
mod step;
mod step_up;
mod tokens;

pub use connections::{CALLBACK_PATH, OAuthBroker};
pub use flow::{AUTHORIZATION_TTL, Authorized, CallbackParams, ConnectOutcome, FlowCookie};
pub use grants::{ConsentLink, LINK_PATH};
pub use step::STEP_TIMEOUT;
pub use tokens::{GRANT_RECHECK, Issued, IssuedToken};

#[cfg(test)]
#[path = "broker_tests.rs"]
mod tests;
