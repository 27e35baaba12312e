-- Deleted MCP gateway sessions (docs/reference.md §13.4), remembered until
-- their session ids would have expired anyway, so a deleted session is
-- refused by every worker of the fleet. Keyed by the lowercase hex SHA-256
-- of the session's inner id (the signed id itself is never stored). Rows
-- past `expires_at_ms` (epoch milliseconds) are purged on the next write;
-- the number of live rows is capped by the store.

CREATE TABLE gateway_session_revocations (
    session_sha256  TEXT PRIMARY KEY,
    expires_at_ms   BIGINT NOT NULL,
    revoked_at_ms   BIGINT NOT NULL
);

CREATE INDEX gateway_session_revocations_expiry
    ON gateway_session_revocations (expires_at_ms);
