//! Getting an entry's connection: the live one, else one connect for all
//! the callers waiting (single flight), within the worker's child-process
//! cap and the entry's backoff (see [`super::backoff`]).

use std::sync::Arc;
use std::time::Instant;

use quiver_model::{Isolation, StoredServer};

use super::entry::Entry;
use super::inner::McpPool;
use super::state::Step;
use crate::connection::{ClientSide, ConnectSettings, Connection};
use crate::error::McpError;
use crate::launch::Launch;

impl McpPool {
    /// Returns the live connection of `entry`, opening one if needed.
    pub(super) async fn connection(&self, entry: &Arc<Entry>) -> Result<Arc<Connection>, McpError> {
        let options = &self.inner.options;
        if let Some(connection) = entry.link.usable()
            // A connection carries one OAuth grant: after a new consent it
            // is stale (closed) and a new one opens below.
            && connection
                .carries_current_grant(options.credentials.as_deref())
                .await
        {
            return Ok(connection);
        }
        let launch = entry.launch.as_ref().map_err(Clone::clone)?;
        let _flight = entry.link.single_flight().await;
        match entry.link.next_step(Instant::now()) {
            Step::Use(connection) => return Ok(connection),
            Step::Refuse(err) => return Err(err),
            Step::Connect { dead: Some(dead) } => {
                tokio::spawn(async move { dead.close().await });
            }
            Step::Connect { dead: None } => {}
        }
        let child_slot = match launch {
            Launch::Stdio(_) => match self.inner.children.clone().try_acquire_owned() {
                Ok(child_slot) => Some(child_slot),
                Err(_) => {
                    // Not a failure of the server: no backoff, it starts as
                    // soon as a slot is free; health says why it waits.
                    let err = McpError::Unavailable(format!(
                        "worker child-process limit reached (max_child_processes = {}): this stdio server is not started until another one stops",
                        options.max_child_processes
                    ));
                    if entry.link.at_child_cap() {
                        tracing::warn!(server_id = %entry.server_id(), error = %err, "mcp server not started");
                    }
                    metrics::counter!("mcp_child_limit_refusals_total", "server_id" => entry.server_id())
                        .increment(1);
                    entry.set_error(&err);
                    return Err(err);
                }
            },
            _ => None,
        };
        // The cause of the backoff this connect ends stays the last error
        // until another one comes.
        if let Some(cause) = entry.link.connecting() {
            entry.set_error(&cause);
        }
        let settings = ConnectSettings {
            max_message_bytes: options.max_message_bytes,
            initialize_timeout: options.initialize_timeout,
            http: options.http.clone(),
            max_concurrent_requests: entry.server.load().spec.budgets.max_concurrency as usize,
            protocol: entry.server.load().spec.protocol,
            egress: options.egress.clone(),
            credentials: options.credentials.clone(),
            principal: entry.principal.clone(),
        };
        let server_id = &entry.server_id();
        let side = ClientSide {
            log: entry.log.clone(),
            relay: entry.relay.clone(),
            events: self.inner.events.clone(),
            tools: entry.tools.clone(),
        };
        // Boxed: opening is a deep future (transport, handshake, eras; ~8 KB
        // in a debug build) that would otherwise sit inline in every call's
        // future, and a debug worker thread's stack overflowed on
        // gateway -> runner -> pool -> connect.
        let opened = Box::pin(Connection::open(
            launch,
            &settings,
            &entry.stderr,
            &side,
            child_slot,
        ))
        .await;
        self.inner.update_child_gauge();
        match opened {
            Ok(connection) => {
                let connection = Arc::new(connection);
                entry.link.connected(connection.clone());
                metrics::counter!("mcp_server_connect_total", "server_id" => server_id.clone())
                    .increment(1);
                tracing::info!(server_id = %server_id, pid = connection.pid(), "mcp server connected");
                Ok(connection)
            }
            Err(err) => {
                let failures = entry.link.failed(err.clone(), options);
                tracing::warn!(server_id = %server_id, failures, error = %err, "mcp server connect failed");
                Err(err)
            }
        }
    }

    /// What the server said of itself when it was connected (capabilities,
    /// implementation, instructions); connects if needed, within
    /// `initialize_timeout`.
    pub async fn server_info(
        &self,
        server: &Arc<StoredServer>,
        principal: Option<&str>,
    ) -> Result<Arc<rmcp::model::ServerPeerInfo>, McpError> {
        // A per-session server introduces itself on its own connection; a
        // per-user one on the caller's.
        let entry = if server.spec.isolation == Isolation::PerSession {
            self.entry(server)
        } else {
            self.call_entry(server, None, principal).await?
        };
        let connection = self.connection(&entry).await?;
        connection
            .peer()
            .peer_info()
            .ok_or_else(|| McpError::Unavailable("the server sent no initialize result".into()))
    }
}
