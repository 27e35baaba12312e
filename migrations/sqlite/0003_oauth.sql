-- OAuth connections: the registry's OAuth credential broker keeps, per named
-- connection, its settings, its tokens and its state here, in the registry's
-- database, so every replica sees the same tokens and they survive restarts.
-- The store never sees a secret in the clear: `client_secret`,
-- `credentials` and `payload` are sealed (encrypted) by the
-- caller and opaque TEXT here; `config` is the non-secret settings as JSON
-- text (only read back, never queried).
--
-- `generation` moves on with every change of config, credentials or status,
-- so a writer that read an older state (a token refresh racing a config
-- change) writes nothing: token writes are conditional on it. The lease
-- columns are the cross-replica lock that lets exactly one replica refresh a
-- connection's tokens at a time. Times are epoch milliseconds.

CREATE TABLE oauth_connections (
    name             TEXT PRIMARY KEY,
    config           TEXT NOT NULL,
    client_secret    TEXT,
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
    lease_until_ms   INTEGER
);

-- Pending authorization-code flows, one-time: taking one deletes it. Each
-- names its connection and the connection's generation when the flow began
-- (a flow started before a config change must not complete).
CREATE TABLE oauth_authorizations (
    state          TEXT PRIMARY KEY,
    name           TEXT NOT NULL,
    generation     INTEGER NOT NULL CHECK (generation >= 0),
    payload        TEXT NOT NULL,
    created_at_ms  INTEGER NOT NULL,
    expires_at_ms  INTEGER NOT NULL
);

-- Deleting a connection's flows; purging expired flows.
CREATE INDEX oauth_authorizations_name ON oauth_authorizations (name);
CREATE INDEX oauth_authorizations_expiry ON oauth_authorizations (expires_at_ms);
