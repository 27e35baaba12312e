//! Quiver's HTTP listeners, hardened against hostile peers: the registry's
//! HTTP and gRPC listeners and the worker's HTTP listener all serve an axum
//! [`Router`](axum::Router) through [`Listener::serve`].
//!
//! Every connection is held to [`ListenerOptions`]: a deadline for its first
//! complete request head counted from accept (TLS handshake and HTTP/2
//! preface included), an idle timeout between requests, and one cap on the
//! open connections of the process ([`Connections`], derived from the
//! descriptor limit, which is raised to its hard limit first). At the cap
//! the oldest connection that is not serving a request makes room, so a
//! health check still gets in during a flood of half-open connections; only
//! when every connection is busy is the new one closed at once.
//!
//! Metrics: `http_connections_open{listener}` and
//! `http_connections_shed_total{listener,reason}` (`reason`: `at_capacity`,
//! `evicted`, `header_timeout`, `idle_timeout`).

mod connections;
mod descriptors;
mod listener;
mod options;
mod tracked;

pub use connections::Connections;
pub use descriptors::raise_descriptor_limit;
pub use listener::Listener;
pub use options::ListenerOptions;
