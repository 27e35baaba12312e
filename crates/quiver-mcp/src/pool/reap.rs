//! Closing what is no longer used: idle connections of servers, and
//! per-session (and per-user) connections past their idle time.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::inner::{PoolInner, retire};

/// Starts the reapers of `pool`; they stop when it shuts down or is gone.
pub(super) fn spawn_reapers(pool: &Arc<PoolInner>) {
    if let Some(idle) = pool.options.idle_timeout {
        tokio::spawn(reap_idle(Arc::downgrade(pool), idle, pool.shutdown.clone()));
    }
    tokio::spawn(reap_idle_leases(
        Arc::downgrade(pool),
        pool.options.session_idle_timeout,
        pool.shutdown.clone(),
    ));
}

/// Closes server connections unused for `idle` with no call in flight;
/// the next call connects again.
async fn reap_idle(pool: Weak<PoolInner>, idle: Duration, shutdown: CancellationToken) {
    let mut timer =
        tokio::time::interval((idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(30)));
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = timer.tick() => {}
        }
        let Some(pool) = pool.upgrade() else { return };
        let entries: Vec<_> = pool.entries().values().cloned().collect();
        for entry in entries {
            if entry.unused_for() < idle || !entry.no_calls() {
                continue;
            }
            if let Some(connection) = entry.link.close() {
                tracing::info!(server_id = %entry.server_id(), "closing idle mcp connection");
                connection.close().await;
                drop(connection);
                pool.update_child_gauge();
            }
        }
    }
}

/// Ends per-session connections unused for their record's
/// `budgets.session_idle_ms` (else `idle`) with no call in flight.
async fn reap_idle_leases(pool: Weak<PoolInner>, idle: Duration, shutdown: CancellationToken) {
    // Often enough for the shortest idle time a record may set (1 s).
    let mut timer = tokio::time::interval(
        (idle / 4).clamp(Duration::from_millis(50), Duration::from_millis(250)),
    );
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = timer.tick() => {}
        }
        let Some(pool) = pool.upgrade() else { return };
        let expired = pool.leases.remove_where(|_, _, entry| {
            // The record's own idle time, else the worker's.
            let idle = entry
                .server
                .load()
                .spec
                .budgets
                .session_idle_ms
                .map_or(idle, Duration::from_millis);
            entry.unused_for() >= idle && entry.no_calls()
        });
        for entry in expired {
            tracing::info!(server_id = %entry.server_id(), "closing idle per-session connection");
            retire(entry, Arc::downgrade(&pool));
        }
    }
}
