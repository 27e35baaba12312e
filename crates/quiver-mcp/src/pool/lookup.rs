//! Which entry serves a request: the server's own, brought up to the
//! record the request resolved (R-SYNC-6), or a lease of it for the
//! caller's session or the caller's own OAuth grant; and the ends of
//! leases.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use quiver_model::{Isolation, McpServerSpec, StoredServer};

use super::entry::Entry;
use super::inner::{McpPool, retire};
use crate::credentials::{CredentialError, GrantRef, Renewal};
use crate::error::McpError;
use crate::leases::{SessionKey, SessionKind};

/// Which records [`McpPool::reconcile`] lets replace an entry's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Adopt {
    /// A call's record, resolved from some snapshot: only one newer than
    /// any the entry has had (a call that raced with a newer snapshot must
    /// not roll it back).
    IfNewer,
    /// The current snapshot's record, whatever its revision: a registry
    /// restored from a backup moves revisions backwards, and the worker
    /// follows it on purpose.
    Current,
}

/// Whether two records need different connections.
fn same_connection(a: &McpServerSpec, b: &McpServerSpec) -> bool {
    a.transport == b.transport
        && a.stdio == b.stdio
        && a.http == b.http
        && a.isolation == b.isolation
        && a.protocol == b.protocol
}

impl McpPool {
    /// The entry serving `server`, created or brought up to its revision.
    pub(super) fn entry(&self, server: &Arc<StoredServer>) -> Arc<Entry> {
        let (entry, retired) = {
            let mut entries = self.inner.entries();
            self.reconcile(&mut entries, server, Adopt::IfNewer)
        };
        if let Some(retired) = retired {
            retire(retired, Arc::downgrade(&self.inner));
        }
        entry
    }

    /// Makes the entry of `server` current, if `adopt` lets the record
    /// replace the entry's: one that keeps the connection settings updates
    /// the entry in place; one that changes them replaces the entry, whose
    /// old connection is returned for retiring.
    fn reconcile(
        &self,
        entries: &mut HashMap<String, Arc<Entry>>,
        server: &Arc<StoredServer>,
        adopt: Adopt,
    ) -> (Arc<Entry>, Option<Arc<Entry>>) {
        let id = &server.spec.server_id;
        let mut newest_revision = server.revision;
        if let Some(entry) = entries.get(id) {
            let current = entry.server.load();
            let keep = match adopt {
                Adopt::IfNewer => entry.newest_revision.load(Ordering::Relaxed) >= server.revision,
                Adopt::Current => Arc::ptr_eq(&current, server) || **current == **server,
            };
            if keep {
                return (entry.clone(), None);
            }
            if same_connection(&current.spec, &server.spec) {
                entry.update(server);
                return (entry.clone(), None);
            }
            newest_revision = newest_revision.max(entry.newest_revision.load(Ordering::Relaxed));
        }
        let entry = Arc::new(Entry::new(server.clone(), &self.inner.options));
        entry
            .newest_revision
            .store(newest_revision, Ordering::Relaxed);
        let retired = entries.insert(id.clone(), entry.clone());
        (entry, retired)
    }

    /// Applies a new registry snapshot (R-SYNC-6): servers that are gone or
    /// disabled are closed, servers whose connection settings changed are
    /// restarted (calls in flight finish on the old connection), and the tool
    /// caches of every changed server are dropped. Every entry takes the
    /// snapshot's record, whatever its revision (see `Adopt::Current`);
    /// unchanged records are the same allocation, so checking all is cheap
    /// and needs no list of what changed (which coalesced updates could lose).
    pub fn apply_snapshot(&self, servers: &BTreeMap<String, Arc<StoredServer>>) {
        let mut retired = Vec::new();
        {
            let mut entries = self.inner.entries();
            entries.retain(|id, entry| {
                let keep = servers.get(id).is_some_and(|s| s.spec.enabled);
                if !keep {
                    retired.push(entry.clone());
                }
                keep
            });
            let ids: Vec<String> = entries.keys().cloned().collect();
            for id in ids {
                if let Some(server) = servers.get(&id) {
                    retired.extend(self.reconcile(&mut entries, server, Adopt::Current).1);
                }
            }
        }
        // A session's connection ends with its record's revision: a changed
        // record starts every session afresh.
        retired.extend(self.inner.leases.remove_where(|server_id, _, lease| {
            servers
                .get(server_id)
                .is_none_or(|s| !s.spec.enabled || **s != **lease.server.load())
        }));
        let pool = Arc::downgrade(&self.inner);
        for entry in retired {
            retire(entry, pool.clone());
        }
    }

    /// Whether `principal`'s requests of `server` need a connection of
    /// their own, carrying the principal's grant: the server's OAuth
    /// connection is per user. Fails when the principal has no grant yet
    /// ([`McpError::AuthorizationRequired`]); other failures to get a
    /// token are left to the connection, which reports them.
    async fn per_user_grant(
        &self,
        server: &StoredServer,
        principal: Option<&str>,
    ) -> Result<bool, McpError> {
        let (Some(auth_ref), Some(source)) = (
            server
                .spec
                .http
                .as_ref()
                .and_then(|http| http.auth_ref.as_ref()),
            &self.inner.options.credentials,
        ) else {
            return Ok(false);
        };
        let grant = GrantRef {
            auth_ref: auth_ref.clone(),
            principal: principal.map(str::to_owned),
        };
        match source.bearer(&grant, Renewal::Current).await {
            Ok(bearer) => Ok(bearer.per_user),
            // Without a caller no connection can carry a grant: fail here,
            // not in a connect that would back off for every caller.
            Err(
                err @ (CredentialError::AuthorizationRequired(_) | CredentialError::NoCaller(_)),
            ) => Err(err.into()),
            Err(CredentialError::Unavailable(_)) => Ok(false),
        }
    }

    /// Whether `principal` may call `server` as far as its OAuth grant
    /// goes: [`McpError::AuthorizationRequired`] when the server's
    /// connection is per user and the principal has not consented (other
    /// failures to get a token are the call's to report).
    pub async fn check_grant(
        &self,
        server: &StoredServer,
        principal: Option<&str>,
    ) -> Result<(), McpError> {
        match self.per_user_grant(server, principal).await {
            Err(err @ McpError::AuthorizationRequired(_)) => Err(err),
            _ => Ok(()),
        }
    }

    /// The entry a caller's request runs on: the server's own; for a
    /// per-session server the lease of the caller's session; for a server
    /// whose OAuth connection is per user the lease of the caller's own
    /// grant (both created on first use, within the caps).
    pub(super) async fn call_entry(
        &self,
        server: &Arc<StoredServer>,
        session: Option<&SessionKey>,
        principal: Option<&str>,
    ) -> Result<Arc<Entry>, McpError> {
        let per_user = self.per_user_grant(server, principal).await?;
        let server_id = &server.spec.server_id;
        let grant_session;
        let session = if server.spec.isolation == Isolation::PerSession {
            let Some(session) = session else {
                return Err(McpError::SessionRequired(format!(
                    "{server_id} keeps state per session (isolation = \"per_session\"): send the x-quiver-session header naming your session (on /mcp endpoints the MCP session is used)"
                )));
            };
            session
        } else if let (true, Some(principal)) = (per_user, principal) {
            grant_session = SessionKey {
                caller: principal.to_owned(),
                task: String::new(),
                kind: SessionKind::Grant,
                session_id: server
                    .spec
                    .http
                    .as_ref()
                    .and_then(|http| http.auth_ref.clone())
                    .unwrap_or_default(),
            };
            &grant_session
        } else {
            return Ok(self.entry(server));
        };
        let carried = per_user.then(|| principal.map(str::to_owned)).flatten();
        let (lease, replaced) = self.inner.leases.lease(
            server_id,
            session,
            |lease| lease.newest_revision.load(Ordering::Relaxed) >= server.revision,
            || {
                tracing::info!(server_id = %server_id, task = %session.task, caller = %session.caller, kind = ?session.kind, "per-session connection leased");
                Arc::new(Entry::leased(server.clone(), &self.inner.options, carried))
            },
        )?;
        if let Some(replaced) = replaced {
            retire(replaced, Arc::downgrade(&self.inner));
        }
        Ok(lease)
    }

    /// Ends `principal`'s own connections carrying its grant of OAuth
    /// connection `auth_ref` (its grant was revoked); returns how many.
    pub fn end_grant(&self, principal: &str, auth_ref: &str) -> usize {
        let ended = self.inner.leases.remove_where(|_, key, _| {
            key.kind == SessionKind::Grant && key.caller == principal && key.session_id == auth_ref
        });
        let count = ended.len();
        let pool = Arc::downgrade(&self.inner);
        for entry in ended {
            retire(entry, pool.clone());
        }
        count
    }

    /// Ends the per-session connections of `session` (every server; only
    /// that caller's session of that kind): calls in flight finish, then
    /// the processes are ended and reaped. Returns how many there were.
    pub fn end_session(&self, session: &SessionKey) -> usize {
        let ended = self.inner.leases.remove_where(|_, key, _| key == session);
        let count = ended.len();
        let pool = Arc::downgrade(&self.inner);
        for entry in ended {
            retire(entry, pool.clone());
        }
        count
    }
}
