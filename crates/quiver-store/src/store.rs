//! The [`Store`] trait, the one interface the registry writes and reads
//! through, and [`SqlStore`]'s implementation of it: each method hands over
//! to the module of its records (`servers`, `access`, `approvals`, `oauth`,
//! `oauth_flows`, `sessions`, `usage`) or to the revision core (`sql`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use quiver_model::access::{AccessKind, StoredAccess};
use quiver_model::approval::{
    Approval, ApprovalBinding, ApprovalDecision, ApprovalState, UseOutcome,
};
use quiver_model::{Change, HistoryEntry, StoredServer};
use tokio::sync::watch;

use crate::access::{AccessDelete, AccessHistoryEntry, AccessOutcome, AccessPut};
use crate::approvals::{DecideOutcome, NewApproval, RequestedApproval};
use crate::error::StoreError;
use crate::oauth::{GrantKey, OAuthConnectionRow, OAuthTokens, SecretUpdate};
use crate::oauth_flows::{OAuthAuthorizationRow, OAuthTicketRow};
use crate::servers::{
    DeleteRequest, HistoryPage, HistoryRow, Snapshot, UpsertOutcome, UpsertRequest,
};
use crate::sql::{Head, SqlStore};
use crate::usage::{CallsLease, UsageBatch};

/// The revisioned record store.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// A consistent snapshot of every record.
    async fn list(&self) -> Result<Snapshot, StoreError>;
    /// One record.
    async fn get(&self, server_id: &str) -> Result<Option<StoredServer>, StoreError>;
    /// Creates or replaces a record (validated first).
    async fn upsert(&self, request: UpsertRequest) -> Result<UpsertOutcome, StoreError>;
    /// Upserts every record of a batch in one transaction, in order, with
    /// the semantics of [`Store::upsert`] per record: the records that change
    /// take one contiguous range of revisions (unchanged ones take none), and
    /// either all are written or none is. A failure is
    /// [`StoreError::InRecord`] naming the record's position; a `server_id`
    /// that appears twice is refused before anything is written.
    async fn apply(&self, requests: Vec<UpsertRequest>) -> Result<Vec<UpsertOutcome>, StoreError>;
    /// Deletes a record; returns the new revision.
    async fn delete(&self, request: DeleteRequest) -> Result<u64, StoreError>;
    /// Every revision of one record, newest first (deleted records included).
    async fn history(&self, server_id: &str) -> Result<Vec<HistoryEntry>, StoreError>;
    /// History rows of every record (or of one), in revision order as
    /// `page` says, each with the same record's previous row. History is
    /// never compacted, so this reaches back to revision 1.
    async fn history_page(&self, page: HistoryPage<'_>) -> Result<Vec<HistoryRow>, StoreError>;
    /// Creates or replaces an access record (validated first) at the next
    /// revision, with its change-log and history rows, in one transaction.
    /// Refused with [`StoreError::MissingReference`] when it names a policy
    /// that does not exist; identical content is a no-op.
    async fn put_access(&self, request: AccessPut) -> Result<AccessOutcome, StoreError>;
    /// Deletes an access record; returns the new revision. Refused with
    /// [`StoreError::InUse`] for a policy that keys or provider rules name.
    async fn delete_access(&self, request: AccessDelete) -> Result<u64, StoreError>;
    /// One access record.
    async fn get_access(
        &self,
        kind: AccessKind,
        name: &str,
    ) -> Result<Option<StoredAccess>, StoreError>;
    /// Every revision of one access record, newest first.
    async fn access_history(
        &self,
        kind: AccessKind,
        name: &str,
    ) -> Result<Vec<AccessHistoryEntry>, StoreError>;
    /// The access history row of exactly `revision`, if that revision
    /// changed an access record (the change feed reads each upsert's
    /// content by it).
    async fn access_at(&self, revision: u64) -> Result<Option<AccessHistoryEntry>, StoreError>;
    /// Records that API keys were used (workers report it); each key's
    /// `last_used_at` only moves forward. Not a revision: use is not
    /// configuration. Unknown ids are ignored.
    async fn touch_api_keys(&self, used: &[(String, DateTime<Utc>)]) -> Result<(), StoreError>;
    /// When each API key was last used, by id (keys never used are absent).
    async fn api_keys_last_used(
        &self,
    ) -> Result<std::collections::BTreeMap<String, DateTime<Utc>>, StoreError>;

    /// Change-log rows with revision > `after`, in order, at most `limit`.
    async fn changes_since(&self, after: u64, limit: u32) -> Result<Vec<Change>, StoreError>;
    /// Current head and compaction floor.
    async fn head(&self) -> Result<Head, StoreError>;
    /// Drops change-log rows at or below `floor` (clamped to head); returns the new head.
    async fn compact(&self, floor: u64) -> Result<Head, StoreError>;
    /// The latest committed revision known to this process, updated as soon as
    /// a change commits here or, for shared databases, in another process.
    fn subscribe(&self) -> watch::Receiver<u64>;

    /// Stores a new pending approval expiring `ttl` from now, or answers
    /// with the pending approval of an identical request (same
    /// `requested_by` and binding; one atomic insert, so racing identical
    /// requests get one id). Refused with [`StoreError::Limit`] when
    /// `requested_by` already has `max_pending` pending approvals.
    async fn create_approval(&self, request: NewApproval) -> Result<RequestedApproval, StoreError>;
    /// Deletes at most `limit` approvals that are denied, used or expired
    /// and whose expiry is before `before`; returns how many.
    async fn purge_approvals(
        &self,
        before: chrono::DateTime<chrono::Utc>,
        limit: u32,
    ) -> Result<u64, StoreError>;
    /// One approval, as stored (an approval past its expiry that no sweep
    /// has marked yet still shows its old state: call [`Store::expire_approvals`] first).
    async fn get_approval(&self, approval_id: &str) -> Result<Option<Approval>, StoreError>;
    /// Approvals in one state (or all), newest first; with every state,
    /// pending ones first.
    async fn list_approvals(
        &self,
        state: Option<ApprovalState>,
        limit: u32,
    ) -> Result<Vec<Approval>, StoreError>;
    /// Marks pending and approved approvals past their expiry `expired`;
    /// returns exactly those this call marked (for audit and metrics).
    async fn expire_approvals(&self) -> Result<Vec<Approval>, StoreError>;
    /// Approves or denies a pending, unexpired approval (one atomic update).
    async fn decide_approval(
        &self,
        approval_id: &str,
        decision: ApprovalDecision,
        decided_by: &str,
        note: Option<String>,
    ) -> Result<DecideOutcome, StoreError>;
    /// Uses an approval for `call`: one atomic update that succeeds only if
    /// it is approved, unexpired and bound to exactly this call, so of any
    /// number of concurrent uses (from any worker) exactly one gets
    /// [`UseOutcome::Used`]. Otherwise returns why, with the approval.
    async fn use_approval(
        &self,
        approval_id: &str,
        call: &ApprovalBinding,
        used_by: &str,
    ) -> Result<(UseOutcome, Option<Approval>), StoreError>;

    /// Creates an OAuth connection (`not_connected`, generation 1) or
    /// updates its settings. When `config` differs from the stored one or
    /// the client secret changes, the connection starts afresh: tokens,
    /// expiry, error and connection time are cleared, the
    /// status becomes `not_connected`, the generation moves on and its
    /// pending authorizations are deleted. When nothing changes, nothing is
    /// written and the row is returned as stored. One transaction.
    async fn put_oauth_connection(
        &self,
        name: &str,
        config: String,
        secret: SecretUpdate,
    ) -> Result<OAuthConnectionRow, StoreError>;
    /// One OAuth connection.
    async fn get_oauth_connection(
        &self,
        name: &str,
    ) -> Result<Option<OAuthConnectionRow>, StoreError>;
    /// Every OAuth connection, ordered by name.
    async fn list_oauth_connections(&self) -> Result<Vec<OAuthConnectionRow>, StoreError>;
    /// Deletes an OAuth connection and its pending authorizations; `true`
    /// when it existed.
    async fn delete_oauth_connection(&self, name: &str) -> Result<bool, StoreError>;
    /// Stores tokens of `grant` (status `connected`, error cleared,
    /// generation + 1) in one conditional update, only if it is still at
    /// `expected_generation`. A principal's first grant (`tokens.refreshed`
    /// false) is conditional on the *connection's* generation instead (the
    /// one its flow started under) and replaces any grant the principal
    /// had. `None`: it changed or vanished meanwhile and nothing was
    /// written.
    async fn store_oauth_tokens(
        &self,
        grant: GrantKey<'_>,
        expected_generation: u64,
        tokens: OAuthTokens,
    ) -> Result<Option<OAuthConnectionRow>, StoreError>;
    /// Marks `grant` `needs_reconsent` (tokens and expiry cleared, `error`
    /// recorded, generation + 1), only if it is still at
    /// `expected_generation`; `None` otherwise (nothing written).
    async fn set_oauth_needs_reconsent(
        &self,
        grant: GrantKey<'_>,
        expected_generation: u64,
        error: &str,
    ) -> Result<Option<OAuthConnectionRow>, StoreError>;
    /// Records a transient failure of `grant`: only `last_error` and
    /// `updated_at` change (status and generation do not).
    async fn set_oauth_error(&self, grant: GrantKey<'_>, error: &str) -> Result<(), StoreError>;
    /// Takes (or extends) the lease of `grant` for `ttl`: one atomic
    /// update that succeeds when no lease is held, the held one has
    /// expired, or `holder` holds it. Of any number of concurrent callers
    /// (on any replica) with different holders, at most one gets `true`.
    async fn acquire_oauth_lease(
        &self,
        grant: GrantKey<'_>,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<bool, StoreError>;
    /// Releases the lease if `holder` holds it; otherwise does nothing.
    async fn release_oauth_lease(
        &self,
        grant: GrantKey<'_>,
        holder: &str,
    ) -> Result<(), StoreError>;
    /// One grant with its connection's settings: the connection's own
    /// ([`Store::get_oauth_connection`]) or a principal's (`None` when the
    /// principal has none).
    async fn get_oauth_grant(
        &self,
        grant: GrantKey<'_>,
    ) -> Result<Option<OAuthConnectionRow>, StoreError>;
    /// Principals' grants, of one connection and/or one principal (both
    /// `None`: every one), ordered by connection and principal.
    async fn list_oauth_user_grants(
        &self,
        connection: Option<&str>,
        principal: Option<&str>,
    ) -> Result<Vec<OAuthConnectionRow>, StoreError>;
    /// Deletes a principal's grant and its pending links and flows; `true`
    /// when the grant existed.
    async fn delete_oauth_user_grant(
        &self,
        connection: &str,
        principal: &str,
    ) -> Result<bool, StoreError>;
    /// Stores an authorization link, after deleting every expired one and,
    /// beyond [`MAX_OAUTH_TICKETS_PER_GRANT`](crate::MAX_OAUTH_TICKETS_PER_GRANT) of the same principal and
    /// connection, its oldest. Refused with [`StoreError::Limit`] when
    /// [`MAX_OAUTH_TICKETS`](crate::MAX_OAUTH_TICKETS) live ones exist.
    async fn create_oauth_ticket(&self, row: OAuthTicketRow) -> Result<(), StoreError>;
    /// The newest link of `principal` for `connection` that is still live at
    /// `live_at` (untaken and not expired by then).
    async fn live_oauth_ticket(
        &self,
        connection: &str,
        principal: &str,
        live_at: DateTime<Utc>,
    ) -> Result<Option<OAuthTicketRow>, StoreError>;
    /// Takes (deletes and returns) a link: of any number of concurrent
    /// takers, exactly one gets it. Returned even if expired; the caller
    /// checks `expires_at`.
    async fn take_oauth_ticket(
        &self,
        ticket_sha256: &str,
    ) -> Result<Option<OAuthTicketRow>, StoreError>;
    /// Stores a pending authorization, after deleting every expired one.
    /// Refused with [`StoreError::Limit`] when
    /// [`MAX_PENDING_OAUTH_AUTHORIZATIONS`](crate::MAX_PENDING_OAUTH_AUTHORIZATIONS) live ones exist.
    async fn create_oauth_authorization(
        &self,
        row: OAuthAuthorizationRow,
    ) -> Result<(), StoreError>;
    /// A pending authorization, left in place (the callback checks the
    /// browser before taking it).
    async fn get_oauth_authorization(
        &self,
        state: &str,
    ) -> Result<Option<OAuthAuthorizationRow>, StoreError>;
    /// Takes (deletes and returns) a pending authorization: of any number
    /// of concurrent takers, exactly one gets it. Returned even if expired;
    /// the caller checks `expires_at`.
    async fn take_oauth_authorization(
        &self,
        state: &str,
    ) -> Result<Option<OAuthAuthorizationRow>, StoreError>;

    /// Remembers a deleted gateway session (by the lowercase hex SHA-256 of
    /// its inner id) until `expires_at`, after purging expired ones; a
    /// second call keeps the later expiry. Refused with
    /// [`StoreError::Limit`] when [`MAX_GATEWAY_SESSION_REVOCATIONS`](crate::MAX_GATEWAY_SESSION_REVOCATIONS)
    /// unexpired ones exist.
    async fn revoke_gateway_session(
        &self,
        session_sha256: &str,
        expires_at: DateTime<Utc>,
    ) -> Result<(), StoreError>;
    /// Until when a gateway session is remembered as deleted; `None` when it
    /// is not (or no longer).
    async fn gateway_session_revocation(
        &self,
        session_sha256: &str,
    ) -> Result<Option<DateTime<Utc>>, StoreError>;

    /// Leases up to `want` calls of the current window of the rate-limit
    /// counter `key` (`limit` calls per `per_s` seconds), opening a new
    /// window when the last one ended. Never grants more than `limit` per
    /// window in all, whoever asks.
    async fn lease_calls(
        &self,
        key: &str,
        limit: u32,
        per_s: u32,
        want: u32,
    ) -> Result<CallsLease, StoreError>;
    /// Gives back `calls` leased from the window that started at
    /// `window_start_ms` and not used; nothing when that window ended.
    async fn give_back_calls(
        &self,
        key: &str,
        window_start_ms: i64,
        calls: u32,
    ) -> Result<(), StoreError>;
    /// Adds a batch of usage counts; `false` when this batch was added
    /// before (and nothing changed).
    async fn record_usage(&self, batch: &UsageBatch) -> Result<bool, StoreError>;
    /// Usage between `since_ms` and `until_ms` grouped by `group` (per
    /// `step_ms` when given), by time then calls; at most
    /// [`MAX_USAGE_ROWS`](crate::MAX_USAGE_ROWS) rows, and whether more there were.
    async fn usage(
        &self,
        group: quiver_model::usage::UsageGroup,
        since_ms: i64,
        until_ms: i64,
        step_ms: Option<i64>,
    ) -> Result<(Vec<quiver_model::usage::UsageTotal>, bool), StoreError>;
    /// Deletes usage rows older than `before_ms`, batch marks older than a
    /// day and rate windows that ended; how many rows went.
    async fn prune_usage(&self, before_ms: i64) -> Result<u64, StoreError>;
}

#[async_trait]
impl Store for SqlStore {
    async fn list(&self) -> Result<Snapshot, StoreError> {
        self.servers_list().await
    }

    async fn get(&self, server_id: &str) -> Result<Option<StoredServer>, StoreError> {
        self.servers_get(server_id).await
    }

    async fn upsert(&self, request: UpsertRequest) -> Result<UpsertOutcome, StoreError> {
        self.servers_upsert(request).await
    }

    async fn apply(&self, requests: Vec<UpsertRequest>) -> Result<Vec<UpsertOutcome>, StoreError> {
        self.servers_apply(requests).await
    }

    async fn delete(&self, request: DeleteRequest) -> Result<u64, StoreError> {
        self.servers_delete(request).await
    }

    async fn history(&self, server_id: &str) -> Result<Vec<HistoryEntry>, StoreError> {
        self.servers_history(server_id).await
    }

    async fn history_page(&self, page: HistoryPage<'_>) -> Result<Vec<HistoryRow>, StoreError> {
        self.servers_history_page(page).await
    }

    async fn put_access(&self, request: AccessPut) -> Result<AccessOutcome, StoreError> {
        self.access_put(request).await
    }

    async fn delete_access(&self, request: AccessDelete) -> Result<u64, StoreError> {
        self.access_delete(request).await
    }

    async fn get_access(
        &self,
        kind: AccessKind,
        name: &str,
    ) -> Result<Option<StoredAccess>, StoreError> {
        self.access_get(kind, name).await
    }

    async fn access_history(
        &self,
        kind: AccessKind,
        name: &str,
    ) -> Result<Vec<AccessHistoryEntry>, StoreError> {
        self.access_history_of(kind, name).await
    }

    async fn access_at(&self, revision: u64) -> Result<Option<AccessHistoryEntry>, StoreError> {
        self.access_history_at(revision).await
    }

    async fn touch_api_keys(&self, used: &[(String, DateTime<Utc>)]) -> Result<(), StoreError> {
        self.access_touch_api_keys(used).await
    }

    async fn api_keys_last_used(
        &self,
    ) -> Result<std::collections::BTreeMap<String, DateTime<Utc>>, StoreError> {
        self.access_api_keys_last_used().await
    }

    async fn changes_since(&self, after: u64, limit: u32) -> Result<Vec<Change>, StoreError> {
        self.changelog_since(after, limit).await
    }

    async fn head(&self) -> Result<Head, StoreError> {
        self.changelog_head().await
    }

    async fn compact(&self, floor: u64) -> Result<Head, StoreError> {
        self.changelog_compact(floor).await
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.head_sender().subscribe()
    }

    async fn create_approval(&self, request: NewApproval) -> Result<RequestedApproval, StoreError> {
        self.approvals_create(request).await
    }

    async fn purge_approvals(&self, before: DateTime<Utc>, limit: u32) -> Result<u64, StoreError> {
        self.approvals_purge(before, limit).await
    }

    async fn get_approval(&self, approval_id: &str) -> Result<Option<Approval>, StoreError> {
        self.approvals_get(approval_id).await
    }

    async fn list_approvals(
        &self,
        state: Option<ApprovalState>,
        limit: u32,
    ) -> Result<Vec<Approval>, StoreError> {
        self.approvals_list(state, limit).await
    }

    async fn expire_approvals(&self) -> Result<Vec<Approval>, StoreError> {
        self.approvals_expire(Utc::now()).await
    }

    async fn decide_approval(
        &self,
        approval_id: &str,
        decision: ApprovalDecision,
        decided_by: &str,
        note: Option<String>,
    ) -> Result<DecideOutcome, StoreError> {
        self.approvals_decide(approval_id, decision, decided_by, note)
            .await
    }

    async fn use_approval(
        &self,
        approval_id: &str,
        call: &ApprovalBinding,
        used_by: &str,
    ) -> Result<(UseOutcome, Option<Approval>), StoreError> {
        self.approvals_use(approval_id, call, used_by).await
    }

    async fn put_oauth_connection(
        &self,
        name: &str,
        config: String,
        secret: SecretUpdate,
    ) -> Result<OAuthConnectionRow, StoreError> {
        self.oauth_put_connection(name, config, secret).await
    }

    async fn get_oauth_connection(
        &self,
        name: &str,
    ) -> Result<Option<OAuthConnectionRow>, StoreError> {
        self.oauth_get_connection(name).await
    }

    async fn list_oauth_connections(&self) -> Result<Vec<OAuthConnectionRow>, StoreError> {
        self.oauth_list_connections().await
    }

    async fn delete_oauth_connection(&self, name: &str) -> Result<bool, StoreError> {
        self.oauth_delete_connection(name).await
    }

    async fn store_oauth_tokens(
        &self,
        grant: GrantKey<'_>,
        expected_generation: u64,
        tokens: OAuthTokens,
    ) -> Result<Option<OAuthConnectionRow>, StoreError> {
        self.oauth_store_tokens(grant, expected_generation, tokens)
            .await
    }

    async fn set_oauth_needs_reconsent(
        &self,
        grant: GrantKey<'_>,
        expected_generation: u64,
        error: &str,
    ) -> Result<Option<OAuthConnectionRow>, StoreError> {
        self.oauth_set_needs_reconsent(grant, expected_generation, error)
            .await
    }

    async fn set_oauth_error(&self, grant: GrantKey<'_>, error: &str) -> Result<(), StoreError> {
        self.oauth_set_error(grant, error).await
    }

    async fn acquire_oauth_lease(
        &self,
        grant: GrantKey<'_>,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<bool, StoreError> {
        self.oauth_acquire_lease(grant, holder, ttl).await
    }

    async fn release_oauth_lease(
        &self,
        grant: GrantKey<'_>,
        holder: &str,
    ) -> Result<(), StoreError> {
        self.oauth_release_lease(grant, holder).await
    }

    async fn get_oauth_grant(
        &self,
        grant: GrantKey<'_>,
    ) -> Result<Option<OAuthConnectionRow>, StoreError> {
        self.oauth_get_grant(grant).await
    }

    async fn list_oauth_user_grants(
        &self,
        connection: Option<&str>,
        principal: Option<&str>,
    ) -> Result<Vec<OAuthConnectionRow>, StoreError> {
        self.oauth_list_user_grants(connection, principal).await
    }

    async fn delete_oauth_user_grant(
        &self,
        connection: &str,
        principal: &str,
    ) -> Result<bool, StoreError> {
        self.oauth_delete_user_grant(connection, principal).await
    }

    async fn create_oauth_ticket(&self, row: OAuthTicketRow) -> Result<(), StoreError> {
        self.oauth_create_ticket(row).await
    }

    async fn live_oauth_ticket(
        &self,
        connection: &str,
        principal: &str,
        live_at: DateTime<Utc>,
    ) -> Result<Option<OAuthTicketRow>, StoreError> {
        self.oauth_live_ticket(connection, principal, live_at).await
    }

    async fn take_oauth_ticket(
        &self,
        ticket_sha256: &str,
    ) -> Result<Option<OAuthTicketRow>, StoreError> {
        self.oauth_take_ticket(ticket_sha256).await
    }

    async fn create_oauth_authorization(
        &self,
        row: OAuthAuthorizationRow,
    ) -> Result<(), StoreError> {
        self.oauth_create_authorization(row).await
    }

    async fn get_oauth_authorization(
        &self,
        state: &str,
    ) -> Result<Option<OAuthAuthorizationRow>, StoreError> {
        self.oauth_get_authorization(state).await
    }

    async fn take_oauth_authorization(
        &self,
        state: &str,
    ) -> Result<Option<OAuthAuthorizationRow>, StoreError> {
        self.oauth_take_authorization(state).await
    }

    async fn revoke_gateway_session(
        &self,
        session_sha256: &str,
        expires_at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.sessions_revoke(session_sha256, expires_at).await
    }

    async fn gateway_session_revocation(
        &self,
        session_sha256: &str,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        self.sessions_revocation(session_sha256).await
    }

    async fn lease_calls(
        &self,
        key: &str,
        limit: u32,
        per_s: u32,
        want: u32,
    ) -> Result<crate::CallsLease, StoreError> {
        self.usage_lease(key, limit, per_s, want).await
    }

    async fn give_back_calls(
        &self,
        key: &str,
        window_start_ms: i64,
        calls: u32,
    ) -> Result<(), StoreError> {
        self.usage_give_back(key, window_start_ms, calls).await
    }

    async fn record_usage(&self, batch: &UsageBatch) -> Result<bool, StoreError> {
        self.usage_record(batch).await
    }

    async fn usage(
        &self,
        group: quiver_model::usage::UsageGroup,
        since_ms: i64,
        until_ms: i64,
        step_ms: Option<i64>,
    ) -> Result<(Vec<quiver_model::usage::UsageTotal>, bool), StoreError> {
        self.usage_totals(group, since_ms, until_ms, step_ms).await
    }

    async fn prune_usage(&self, before_ms: i64) -> Result<u64, StoreError> {
        self.usage_prune(before_ms).await
    }
}
