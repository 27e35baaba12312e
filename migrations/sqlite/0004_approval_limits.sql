-- Issue #21: pending approvals are bounded per caller and identical pending
-- requests share one approval; decided, used and expired approvals are
-- purged after a retention period; an OAuth authorization flow is bound to
-- the browser that started it (docs/reference.md §13.6, §13.7).

-- Identical pending requests that exist already: the newest stays pending,
-- the others are expired (so the unique index below can be built).
UPDATE approvals SET state = 'expired'
WHERE state = 'pending' AND EXISTS (
    SELECT 1 FROM approvals AS newer
    WHERE newer.state = 'pending'
      AND newer.requested_by = approvals.requested_by
      AND newer.task = approvals.task
      AND newer.server_id = approvals.server_id
      AND newer.tool = approvals.tool
      AND newer.arguments_hash = approvals.arguments_hash
      AND newer.record_revision = approvals.record_revision
      AND (newer.requested_at_ms > approvals.requested_at_ms
           OR (newer.requested_at_ms = approvals.requested_at_ms
               AND newer.approval_id > approvals.approval_id))
);

-- One pending approval per (caller, call); also counts a caller's pending ones.
CREATE UNIQUE INDEX approvals_pending_call
    ON approvals (requested_by, task, server_id, tool, arguments_hash, record_revision)
    WHERE state = 'pending';

-- The purge of finished approvals, oldest expiry first.
CREATE INDEX approvals_done_expiry ON approvals (expires_at_ms)
    WHERE state IN ('denied', 'used', 'expired');

-- SHA-256 (hex) of the nonce cookie set in the browser that started the
-- flow; the callback must present it. NULL for flows started before.
ALTER TABLE oauth_authorizations ADD COLUMN browser_hash TEXT;
