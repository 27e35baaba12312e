-- Approvals (docs/reference.md §13.7): one-time permissions for one call,
-- bound to (task, server_id, tool, arguments_hash, record_revision). Kept in
-- the registry's database so every worker honours them and they survive
-- worker restarts. Arguments are JSON text, as requested (the same column
-- type on both backends: they are only shown, never queried).

CREATE TABLE approvals (
    approval_id      TEXT PRIMARY KEY,
    state            TEXT NOT NULL
        CHECK (state IN ('pending', 'approved', 'denied', 'used', 'expired')),
    task             TEXT NOT NULL,
    server_id        TEXT NOT NULL,
    tool             TEXT NOT NULL,
    arguments        TEXT NOT NULL,
    arguments_hash   TEXT NOT NULL,
    record_revision  BIGINT NOT NULL CHECK (record_revision >= 0),
    requested_by     TEXT NOT NULL,
    requested_at_ms  BIGINT NOT NULL,
    expires_at_ms    BIGINT NOT NULL,
    decided_by       TEXT,
    decided_at_ms    BIGINT,
    note             TEXT,
    used_at_ms       BIGINT,
    used_by          TEXT
);

-- Listing by state, newest first; the expiry sweep looks at live states only.
CREATE INDEX approvals_state_requested ON approvals (state, requested_at_ms);
CREATE INDEX approvals_live_expiry ON approvals (expires_at_ms)
    WHERE state IN ('pending', 'approved');
