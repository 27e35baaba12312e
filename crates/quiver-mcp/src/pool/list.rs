//! Listing a server's tools: from the cache while it is fresh, else one
//! fetch shared by every caller waiting (R-MCP-4), paged within the pool's
//! listing limits.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use quiver_model::{Isolation, StoredServer};
use rmcp::model::Tool;

use super::call::map_service_error;
use super::entry::Entry;
use super::inner::McpPool;
use crate::error::McpError;

impl McpPool {
    /// Connects a server ahead of its first call and loads its tools.
    pub async fn warm_up(&self, server: &Arc<StoredServer>) -> Result<(), McpError> {
        self.list_tools(server).await.map(|_| ())
    }

    /// The server's cached tool list (or recent listing failure), without
    /// any I/O; `None` when [`list_tools`](Self::list_tools) would have to
    /// fetch.
    pub fn cached_tools(
        &self,
        server: &Arc<StoredServer>,
    ) -> Option<Result<Arc<Vec<Tool>>, McpError>> {
        let entry = self.entry(server);
        let options = &self.inner.options;
        let hit = entry
            .tools
            .lookup(options.tools_ttl, options.tools_negative_ttl)?;
        metrics::counter!("mcp_tools_list_cache_hits_total", "server_id" => entry.server_id())
            .increment(1);
        Some(hit)
    }

    /// The server's tools, waiting at most `wait` for them: a listing not
    /// done by then goes on in a task of its own (and serves later callers),
    /// while this caller gets an error, also shown in the server's health.
    pub async fn list_tools_within(
        &self,
        server: &Arc<StoredServer>,
        principal: Option<&str>,
        wait: Duration,
    ) -> Result<Arc<Vec<Tool>>, McpError> {
        // The steady state: answered from the cache, no task needed.
        if let Some(cached) = self.cached_tools(server) {
            return cached;
        }
        let listing = {
            let (pool, server) = (self.clone(), server.clone());
            let principal = principal.map(str::to_owned);
            tokio::spawn(async move { pool.list_tools_for(&server, principal.as_deref()).await })
        };
        match tokio::time::timeout(wait, listing).await {
            Ok(Ok(listed)) => listed,
            Ok(Err(join)) => Err(McpError::Unavailable(format!(
                "listing tools failed: {join}"
            ))),
            Err(_) => {
                let err = McpError::Unavailable(format!(
                    "tools not listed within {} ms (the server is still connecting or has not answered tools/list)",
                    wait.as_millis()
                ));
                self.entry(server).listed(Err(&err));
                Err(err)
            }
        }
    }

    /// The server's tools: cached with a TTL, failures cached briefly, and
    /// concurrent misses sharing one fetch (R-MCP-4). Follows pagination
    /// within the pool's listing limits (`max_list_pages`, …).
    pub async fn list_tools(&self, server: &Arc<StoredServer>) -> Result<Arc<Vec<Tool>>, McpError> {
        self.list_tools_for(server, None).await
    }

    /// [`list_tools`](Self::list_tools) for `principal`. A server whose
    /// OAuth connection is per user is listed through the principal's own
    /// connection, and its listing kept on the server's entry too: a
    /// server's tools are the server's, so a caller without a grant is
    /// offered them as another caller's connection listed them (calling
    /// one then asks it to consent); before anyone listed them, its
    /// listing fails with [`McpError::AuthorizationRequired`].
    pub async fn list_tools_for(
        &self,
        server: &Arc<StoredServer>,
        principal: Option<&str>,
    ) -> Result<Arc<Vec<Tool>>, McpError> {
        let shared = self.entry(server);
        let options = &self.inner.options;
        let entry = if server.spec.isolation == Isolation::PerSession {
            // Listing needs no session: the server's own connection lists.
            shared.clone()
        } else {
            if let Some(Ok(listed)) = shared
                .tools
                .lookup(options.tools_ttl, options.tools_negative_ttl)
            {
                metrics::counter!("mcp_tools_list_cache_hits_total", "server_id" => shared.server_id())
                    .increment(1);
                return Ok(listed);
            }
            self.call_entry(server, None, principal).await?
        };
        if !Arc::ptr_eq(&entry, &shared) {
            let listed = self.list_entry_tools(&entry).await?;
            let kept = listed.clone();
            let _ = shared
                .tools
                .get_or_fetch(options.tools_ttl, options.tools_negative_ttl, async move {
                    Ok(kept)
                })
                .await;
            return Ok(listed);
        }
        self.list_entry_tools(&entry).await
    }

    /// The tools of `entry`'s server through its connection (see
    /// [`list_tools`](Self::list_tools)).
    async fn list_entry_tools(&self, entry: &Arc<Entry>) -> Result<Arc<Vec<Tool>>, McpError> {
        let entry = entry.clone();
        let options = &self.inner.options;
        let fetched = AtomicBool::new(false);
        let fetch = {
            let entry = entry.clone();
            let pool = self.clone();
            let fetched = &fetched;
            async move {
                fetched.store(true, Ordering::Relaxed);
                let connection = pool.connection(&entry).await?;
                entry.touch();
                let limits = pool.inner.options.list_limits();
                let listed = limits
                    .list_tools(connection.peer(), |err| map_service_error(err, 0))
                    .await;
                match listed {
                    Ok(tools) => {
                        entry.listed(Ok(()));
                        Ok(Arc::new(tools))
                    }
                    Err(err) => {
                        entry.listed(Err(&err));
                        tracing::warn!(server_id = %entry.server_id(), error = %err, "mcp server tools/list failed");
                        pool.inner.forget_if_closed(&entry, connection).await;
                        Err(err)
                    }
                }
            }
        };
        let result = entry
            .tools
            .get_or_fetch(options.tools_ttl, options.tools_negative_ttl, fetch)
            .await;
        let server_id = entry.server_id();
        if fetched.load(Ordering::Relaxed) {
            metrics::counter!("mcp_tools_list_cache_misses_total", "server_id" => server_id)
                .increment(1);
        } else {
            metrics::counter!("mcp_tools_list_cache_hits_total", "server_id" => server_id)
                .increment(1);
        }
        result
    }
}
