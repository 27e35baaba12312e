-- Access records (docs/reference.md §12.2): policies, API keys and identity
-- providers. They share the server records' revision space: every change
-- takes the next global revision under the `registry_head` lock, appends a
-- change-log row (its `access_kind` says which kind; NULL is a server
-- record) and an `access_history` row, in one transaction. `spec` holds the
-- tagged record as written by the store ({"kind": …, "spec": …}). Same shape
-- as migrations/postgres; JSON is stored as TEXT.

CREATE TABLE access_records (
    kind          TEXT NOT NULL CHECK (kind IN ('policy', 'api_key', 'identity_provider')),
    name          TEXT NOT NULL,
    spec          TEXT NOT NULL,
    revision      INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    updated_by    TEXT NOT NULL,
    source        TEXT NOT NULL,
    PRIMARY KEY (kind, name)
);

-- Never compacted, like mcp_server_history. One row per revision (the
-- primary key is the rowid).
CREATE TABLE access_history (
    revision INTEGER PRIMARY KEY,
    kind     TEXT NOT NULL CHECK (kind IN ('policy', 'api_key', 'identity_provider')),
    name     TEXT NOT NULL,
    change   TEXT NOT NULL CHECK (change IN ('upsert', 'delete')),
    spec     TEXT,
    at_ms    INTEGER NOT NULL,
    actor    TEXT NOT NULL,
    source   TEXT NOT NULL
);

-- One record's history, newest first.
CREATE INDEX access_history_record ON access_history (kind, name, revision);

ALTER TABLE mcp_server_changes ADD COLUMN access_kind TEXT
    CHECK (access_kind IN ('policy', 'api_key', 'identity_provider'));

-- When each API key was last used (epoch milliseconds), as workers report
-- it. Use is not configuration: no revision, no history; the row goes with
-- its key.
CREATE TABLE api_key_usage (
    key_id          TEXT PRIMARY KEY,
    last_used_at_ms INTEGER NOT NULL
);
