-- The registry: current records, a global revision, a compactable change log
-- (the watch feed) and the full history of every record (audit and rollback).
-- Same shape as migrations/postgres; JSON is stored as TEXT.

CREATE TABLE registry_head (
    id               INTEGER PRIMARY KEY CHECK (id = 1),
    revision         INTEGER NOT NULL CHECK (revision >= 0),
    compaction_floor INTEGER NOT NULL CHECK (compaction_floor >= 0)
);
INSERT INTO registry_head (id, revision, compaction_floor) VALUES (1, 0, 0);

CREATE TABLE mcp_servers (
    server_id     TEXT PRIMARY KEY,
    spec          TEXT NOT NULL,
    revision      INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    updated_by    TEXT NOT NULL,
    source        TEXT NOT NULL
);

CREATE TABLE mcp_server_changes (
    revision  INTEGER PRIMARY KEY,
    server_id TEXT NOT NULL,
    kind      TEXT NOT NULL CHECK (kind IN ('upsert', 'delete')),
    at_ms     INTEGER NOT NULL,
    actor     TEXT NOT NULL
);

CREATE TABLE mcp_server_history (
    server_id TEXT NOT NULL,
    revision  INTEGER NOT NULL,
    kind      TEXT NOT NULL CHECK (kind IN ('upsert', 'delete')),
    spec      TEXT,
    at_ms     INTEGER NOT NULL,
    actor     TEXT NOT NULL,
    source    TEXT NOT NULL,
    PRIMARY KEY (server_id, revision)
);
