//! Per-session connections of `isolation = "per_session"` servers
//! (docs/reference.md §13.1).
//!
//! A stateful server (a browser, a shell, an in-memory store) must not let
//! one conversation see another's state, so each (server, caller's task,
//! session) gets a connection of its own, created on the session's first
//! call and never shared. This module is the map of those leases and its
//! caps; the pool owns what a lease holds (an entry with its own connection,
//! budgets and stderr) and ends leases: when the caller ends the session,
//! after the idle timeout, when the record changes or goes, and at shutdown.
//!
//! The caps refuse a new session, never evict a live one: a busy session
//! keeps its process however many others knock.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::error::McpError;

/// Whose session a per-session connection belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey {
    /// The caller's task (sessions of one id but different tasks are
    /// different sessions).
    pub task: String,
    /// The session id (`x-quiver-session`, or the MCP session).
    pub session_id: String,
}

/// Caps on live per-session connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseLimits {
    /// Per server.
    pub per_server: usize,
    /// On the whole worker.
    pub total: usize,
}

impl Default for LeaseLimits {
    fn default() -> Self {
        LeaseLimits {
            per_server: 64,
            total: 256,
        }
    }
}

/// The leases, keyed by server id and session.
pub(crate) struct Leases<E> {
    map: Mutex<HashMap<(String, SessionKey), E>>,
    limits: LeaseLimits,
}

impl<E: Clone> Leases<E> {
    pub(crate) fn new(limits: LeaseLimits) -> Self {
        Leases {
            map: Mutex::new(HashMap::new()),
            limits,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, SessionKey), E>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lease of `session` on `server_id`: the current one if `current`
    /// accepts it, else a new one from `make` (the one it replaces is
    /// returned for closing), within the caps.
    pub(crate) fn lease(
        &self,
        server_id: &str,
        session: &SessionKey,
        current: impl Fn(&E) -> bool,
        make: impl FnOnce() -> E,
    ) -> Result<(E, Option<E>), McpError> {
        let mut map = self.lock();
        let key = (server_id.to_owned(), session.clone());
        if let Some(lease) = map.get(&key)
            && current(lease)
        {
            return Ok((lease.clone(), None));
        }
        let replaced = map.remove(&key);
        if replaced.is_none() {
            let of_server = map.keys().filter(|(id, _)| id == server_id).count();
            if of_server >= self.limits.per_server {
                return Err(McpError::Unavailable(format!(
                    "session capacity of {server_id} reached ({of_server} live sessions, max_session_connections_per_server = {}); end a session (DELETE /v1/sessions/{{id}}) or retry later",
                    self.limits.per_server
                )));
            }
            if map.len() >= self.limits.total {
                return Err(McpError::Unavailable(format!(
                    "worker session capacity reached ({} live sessions, max_session_connections = {}); end a session or retry later",
                    map.len(),
                    self.limits.total
                )));
            }
        }
        let lease = make();
        map.insert(key, lease.clone());
        Ok((lease, replaced))
    }

    /// Removes the leases `remove` picks; returns them for closing.
    pub(crate) fn remove_where(
        &self,
        mut remove: impl FnMut(&str, &SessionKey, &E) -> bool,
    ) -> Vec<E> {
        let mut removed = Vec::new();
        self.lock().retain(|(server_id, session), lease| {
            let gone = remove(server_id, session, lease);
            if gone {
                removed.push(lease.clone());
            }
            !gone
        });
        removed
    }

    /// Live leases per server id.
    pub(crate) fn counts(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for (server_id, _) in self.lock().keys() {
            *counts.entry(server_id.clone()).or_default() += 1;
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(id: &str) -> SessionKey {
        SessionKey {
            task: "default".into(),
            session_id: id.into(),
        }
    }

    #[test]
    fn sessions_get_their_own_lease_within_the_caps() {
        let leases = Leases::new(LeaseLimits {
            per_server: 2,
            total: 3,
        });
        let mut made = 0;
        let mut lease = |server: &str, id: &str| {
            leases.lease(
                server,
                &session(id),
                |_| true,
                || {
                    made += 1;
                    made
                },
            )
        };
        assert_eq!(lease("a", "s1").unwrap().0, 1);
        assert_eq!(lease("a", "s1").unwrap().0, 1, "reused");
        assert_eq!(lease("a", "s2").unwrap().0, 2);
        let full = lease("a", "s3").unwrap_err().to_string();
        assert!(full.contains("session capacity of a"), "{full}");
        assert_eq!(lease("b", "s1").unwrap().0, 3);
        let full = lease("c", "s1").unwrap_err().to_string();
        assert!(full.contains("worker session capacity"), "{full}");
        assert_eq!(leases.counts()["a"], 2);
        let ended = leases.remove_where(|_, key, _| key.session_id == "s1");
        assert_eq!(ended.len(), 2);
        assert_eq!(leases.counts().values().sum::<usize>(), 1);
    }

    #[test]
    fn a_stale_lease_is_replaced_and_returned() {
        let leases = Leases::new(LeaseLimits::default());
        leases.lease("a", &session("s"), |_| true, || 1).unwrap();
        let (lease, replaced) = leases
            .lease("a", &session("s"), |old| *old == 2, || 2)
            .unwrap();
        assert_eq!((lease, replaced), (2, Some(1)));
    }
}
