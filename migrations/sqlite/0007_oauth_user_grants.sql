-- Per-user OAuth grants (docs/reference.md §13.6, R-OAUTH-8): a connection
-- whose settings say `per_user` keeps one grant per caller principal
-- (`key:<id>`, `oidc:<issuer>#<sub>`) here instead of in its own row. The
-- columns mean what they mean on oauth_connections: `credentials` is sealed
-- by the caller (bound to the connection, the principal and the column),
-- token writes are conditional on `generation`, and the lease columns let
-- one replica refresh one principal's token at a time. A change of the
-- connection's settings deletes its grants (they were granted for the old
-- ones), as does deleting the connection. Times are epoch milliseconds.

CREATE TABLE oauth_user_grants (
    name             TEXT NOT NULL,
    principal        TEXT NOT NULL,
    credentials      TEXT,
    status           TEXT NOT NULL
        CHECK (status IN ('not_connected', 'connected', 'needs_reconsent')),
    expires_at_ms    INTEGER,
    generation       INTEGER NOT NULL CHECK (generation >= 0),
    refresh_count    INTEGER NOT NULL CHECK (refresh_count >= 0),
    last_error       TEXT,
    connected_at_ms  INTEGER,
    updated_at_ms    INTEGER NOT NULL,
    lease_holder     TEXT,
    lease_until_ms   INTEGER,
    PRIMARY KEY (name, principal)
);

-- A principal's own grants.
CREATE INDEX oauth_user_grants_principal ON oauth_user_grants (principal);

-- A flow that authorizes one principal's grant names it (NULL: the
-- connection's own, started by an admin's Connect).
ALTER TABLE oauth_authorizations ADD COLUMN principal TEXT;

-- Authorization links handed to a principal whose call needs its consent:
-- following one (once, before it expires) starts that principal's flow.
-- Keyed by the SHA-256 of the link's secret; the secret itself only sealed
-- (`sealed_secret`), so the principal's next refusals hand out the same
-- link until it is used or expires.
CREATE TABLE oauth_grant_tickets (
    ticket_sha256  TEXT PRIMARY KEY,
    name           TEXT NOT NULL,
    principal      TEXT NOT NULL,
    sealed_secret  TEXT NOT NULL,
    created_at_ms  INTEGER NOT NULL,
    expires_at_ms  INTEGER NOT NULL
);

-- A principal's live links of one connection (capped); purging expired ones.
CREATE INDEX oauth_grant_tickets_owner ON oauth_grant_tickets (name, principal, created_at_ms);
CREATE INDEX oauth_grant_tickets_expiry ON oauth_grant_tickets (expires_at_ms);
