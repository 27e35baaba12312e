//! Per-session connections of `isolation = "per_session"` servers
//! (docs/reference.md §13.1).
//!
//! A stateful server (a browser, a shell, an in-memory store) must not let
//! one conversation see another's state, so each (server, caller, kind of
//! session, session) gets a connection of its own, created on the session's
//! first call and never shared. A session name is the caller's own: another
//! caller naming it gets a session of its own, and gateway sessions are a
//! namespace apart from the names callers choose. This module is the map of those leases and its
//! caps; the pool owns what a lease holds (an entry with its own connection,
//! budgets and stderr) and ends leases: when the caller ends the session,
//! after the idle timeout, when the record changes or goes, and at shutdown.
//!
//! The caps refuse a new session, never evict a live one: a busy session
//! keeps its process however many others knock. One caller gets at most
//! [`LeaseLimits::per_caller`] of them, so it cannot take the slots of the
//! others.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::error::McpError;

/// Where a session id comes from: the two are separate namespaces, so a
/// name a caller chooses never reaches a gateway session's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SessionKind {
    /// A name the caller chose (`x-quiver-session` on the tool API and chat).
    #[default]
    Api,
    /// An MCP session of the gateway (its id, which the worker made).
    Gateway,
    /// Not a session: a caller's own connection to a server whose OAuth
    /// connection is per user (R-OAUTH-8), carrying that caller's grant;
    /// the session id is the OAuth connection's name. Every request of
    /// the caller shares it.
    Grant,
}

/// Whose session a per-session connection belongs to: sessions differ when
/// any part differs, so one caller never reaches another's connections
/// whatever session id it names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey {
    /// The caller's principal (`token:<id>`, or `anonymous`): the owner.
    pub caller: String,
    /// The caller's task (a token's task may change with its
    /// configuration; its sessions then start afresh).
    pub task: String,
    /// Which namespace `session_id` is in.
    pub kind: SessionKind,
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
    /// Of one caller, on the whole worker (every server, both kinds of
    /// session).
    pub per_caller: usize,
}

impl Default for LeaseLimits {
    fn default() -> Self {
        LeaseLimits {
            per_server: 64,
            total: 256,
            per_caller: 16,
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
            // The caller's own share first: a caller at its cap is told so,
            // not that the worker is full.
            let of_caller = map
                .keys()
                .filter(|(_, key)| key.caller == session.caller)
                .count();
            if of_caller >= self.limits.per_caller {
                return Err(McpError::Unavailable(format!(
                    "session capacity of this caller reached ({of_caller} live session connections, max_session_connections_per_caller = {}); end a session (DELETE /v1/sessions/{{id}}) or retry later",
                    self.limits.per_caller
                )));
            }
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

    fn key(caller: &str, kind: SessionKind, id: &str) -> SessionKey {
        SessionKey {
            caller: caller.into(),
            task: "default".into(),
            kind,
            session_id: id.into(),
        }
    }

    fn session(id: &str) -> SessionKey {
        key("token:a", SessionKind::Api, id)
    }

    #[test]
    fn sessions_get_their_own_lease_within_the_caps() {
        let leases = Leases::new(LeaseLimits {
            per_server: 2,
            total: 3,
            per_caller: 8,
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

    #[test]
    fn a_session_name_is_its_callers_own_and_gateway_ids_are_apart() {
        let leases = Leases::new(LeaseLimits::default());
        let mut made = 0;
        let mut lease = |key: &SessionKey| {
            leases
                .lease(
                    "s",
                    key,
                    |_| true,
                    || {
                        made += 1;
                        made
                    },
                )
                .unwrap()
                .0
        };
        let alice = key("token:alice", SessionKind::Api, "sess");
        assert_eq!(lease(&alice), 1);
        assert_eq!(lease(&key("token:bob", SessionKind::Api, "sess")), 2);
        assert_eq!(lease(&key("token:alice", SessionKind::Gateway, "sess")), 3);
        assert_eq!(lease(&alice), 1, "alice's own session is reused");
        // Bob ending "sess" ends only his.
        let bob = key("token:bob", SessionKind::Api, "sess");
        let ended = leases.remove_where(|_, key, _| *key == bob);
        assert_eq!(ended, vec![2]);
        assert_eq!(leases.counts()["s"], 2);
    }

    #[test]
    fn one_caller_at_its_cap_leaves_room_for_the_others() {
        let leases = Leases::new(LeaseLimits {
            per_server: 64,
            total: 256,
            per_caller: 2,
        });
        let lease = |caller: &str, id: &str| {
            leases.lease("s", &key(caller, SessionKind::Api, id), |_| true, || ())
        };
        lease("token:greedy", "1").unwrap();
        leases
            .lease(
                "other",
                &key("token:greedy", SessionKind::Gateway, "2"),
                |_| true,
                || (),
            )
            .unwrap();
        let full = lease("token:greedy", "3").unwrap_err().to_string();
        assert!(
            full.contains("max_session_connections_per_caller = 2"),
            "{full}"
        );
        // Its live sessions are kept (and reusable); another caller opens one.
        lease("token:greedy", "1").unwrap();
        lease("token:other", "1").unwrap();
        assert_eq!(leases.counts().values().sum::<usize>(), 3);
    }
}
