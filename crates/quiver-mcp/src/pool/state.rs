//! The connection state of one entry (a server, or one session's or one
//! principal's lease of it): the one place that holds the entry's
//! connection, or why it has none.
//!
//! ```text
//! Closed ─▶ Connecting ─┬─ ok ────────────▶ Ready ─ retired ─▶ Recycling
//!   ▲          ▲        ├─ failed ────────▶ BackingOff ─ delay over ─┐
//!   │          │        └─ no child slot ─▶ AtChildCap ──────────────┤
//!   │          └──────────────────── next call ──────────────────────┘
//!   └── from Ready or Recycling once the connection is closed: crashed,
//!       recycled after `cancel_grace`, idle, or its calls done
//! ```
//!
//! Transitions are short critical sections under a plain mutex, so
//! health and the calls' fast path never wait for a connect; the connect
//! itself is single-flight under [`Link::single_flight`].

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::backoff::{Backoff, refusal};
use super::options::PoolOptions;
use crate::connection::Connection;
use crate::error::McpError;

/// Where one entry's connection stands.
#[derive(Clone)]
pub(super) enum ConnectionState {
    /// No connection: none opened yet, or the last one closed (crashed,
    /// recycled after `cancel_grace`, or idle).
    Closed,
    /// A caller is opening the connection (the others wait for it).
    /// `retrying`: the last attempt failed or was refused.
    Connecting { retrying: bool },
    /// A live connection (until the pool sees it closed).
    Ready(Arc<Connection>),
    /// The last connect failed with `cause`; none is tried before `until`.
    BackingOff { until: Instant, cause: McpError },
    /// The last connect was refused by `max_child_processes`: not a failure
    /// of the server, so no backoff; it starts once a slot is free.
    AtChildCap,
    /// The entry was replaced or removed: its connection still serves the
    /// calls already on their way to it, and closes when they are done.
    Recycling(Arc<Connection>),
}

/// What a caller that holds [`Link::single_flight`] does next.
pub(super) enum Step {
    /// Use this live connection (another caller just opened it).
    Use(Arc<Connection>),
    /// Fail at once: the entry backs off.
    Refuse(McpError),
    /// Connect; `dead` is a closed connection to close meanwhile.
    Connect { dead: Option<Arc<Connection>> },
}

/// A copy of the state for health.
pub(super) struct View {
    pub(super) state: ConnectionState,
    /// Connections opened so far.
    pub(super) connects: u64,
}

struct Inner {
    state: ConnectionState,
    backoff: Backoff,
    connects: u64,
}

/// One entry's connection state and its single-flight connect.
pub(super) struct Link {
    inner: Mutex<Inner>,
    /// Held for a whole connect, so concurrent callers wait for one
    /// connect instead of each starting their own.
    connecting: tokio::sync::Mutex<()>,
}

impl Default for Link {
    fn default() -> Self {
        Link {
            inner: Mutex::new(Inner {
                state: ConnectionState::Closed,
                backoff: Backoff::default(),
                connects: 0,
            }),
            connecting: tokio::sync::Mutex::new(()),
        }
    }
}

impl Link {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The connection calls may use now, if any: a retired entry's too, as
    /// long as it is open.
    pub(super) fn usable(&self) -> Option<Arc<Connection>> {
        match &self.lock().state {
            ConnectionState::Ready(connection) | ConnectionState::Recycling(connection)
                if !connection.is_closed() =>
            {
                Some(connection.clone())
            }
            _ => None,
        }
    }

    /// Waits until no other caller is connecting; connect (see
    /// [`next_step`](Self::next_step)) while holding the guard.
    pub(super) async fn single_flight(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.connecting.lock().await
    }

    /// What to do under [`single_flight`](Self::single_flight). A
    /// `Connecting` state found here was left by a caller that gave up
    /// waiting for its connect: connecting again is right.
    pub(super) fn next_step(&self, now: Instant) -> Step {
        let mut inner = self.lock();
        let dead = match &inner.state {
            ConnectionState::Ready(connection) | ConnectionState::Recycling(connection) => {
                if !connection.is_closed() {
                    return Step::Use(connection.clone());
                }
                Some(connection.clone())
            }
            ConnectionState::BackingOff { until, cause } if now < *until => {
                return Step::Refuse(refusal(until.saturating_duration_since(now), cause));
            }
            _ => None,
        };
        if dead.is_some() {
            inner.state = ConnectionState::Closed;
        }
        Step::Connect { dead }
    }

    /// The connect was refused for want of a child slot; returns whether
    /// it just was (it was not at the last attempt).
    pub(super) fn at_child_cap(&self) -> bool {
        let mut inner = self.lock();
        let newly = !matches!(inner.state, ConnectionState::AtChildCap);
        inner.state = ConnectionState::AtChildCap;
        newly
    }

    /// A connect starts; returns the cause of the backoff it ends, which
    /// is the entry's last error from now on.
    pub(super) fn connecting(&self) -> Option<McpError> {
        let mut inner = self.lock();
        let retrying =
            inner.backoff.failures() > 0 || matches!(inner.state, ConnectionState::AtChildCap);
        match std::mem::replace(&mut inner.state, ConnectionState::Connecting { retrying }) {
            ConnectionState::BackingOff { cause, .. } => Some(cause),
            _ => None,
        }
    }

    /// The connect succeeded; the next failure starts a new backoff.
    pub(super) fn connected(&self, connection: Arc<Connection>) {
        let mut inner = self.lock();
        inner.connects += 1;
        inner.backoff = Backoff::default();
        inner.state = ConnectionState::Ready(connection);
    }

    /// The connect failed; returns the consecutive failures so far.
    pub(super) fn failed(&self, cause: McpError, options: &PoolOptions) -> u32 {
        let mut inner = self.lock();
        let delay = inner.backoff.failed(options);
        inner.state = ConnectionState::BackingOff {
            until: Instant::now() + delay,
            cause,
        };
        inner.backoff.failures()
    }

    /// Forgets `dead` if it is still the entry's connection.
    pub(super) fn forget(&self, dead: &Arc<Connection>) {
        let mut inner = self.lock();
        if let ConnectionState::Ready(connection) | ConnectionState::Recycling(connection) =
            &inner.state
            && Arc::ptr_eq(connection, dead)
        {
            inner.state = ConnectionState::Closed;
        }
    }

    /// Takes the live connection, for closing (idle, or the pool shuts
    /// down); a recycling one is left to its retirement.
    pub(super) fn close(&self) -> Option<Arc<Connection>> {
        let mut inner = self.lock();
        match std::mem::replace(&mut inner.state, ConnectionState::Closed) {
            ConnectionState::Ready(connection) => Some(connection),
            other => {
                inner.state = other;
                None
            }
        }
    }

    /// The entry was retired: its connection (returned) serves the calls
    /// on their way, then is closed.
    pub(super) fn recycle(&self) -> Option<Arc<Connection>> {
        let mut inner = self.lock();
        let ConnectionState::Ready(connection) = &inner.state else {
            return None;
        };
        let connection = connection.clone();
        inner.state = ConnectionState::Recycling(connection.clone());
        Some(connection)
    }

    /// A copy of the state, for health.
    pub(super) fn view(&self) -> View {
        let inner = self.lock();
        View {
            state: inner.state.clone(),
            connects: inner.connects,
        }
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
