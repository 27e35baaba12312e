-- The registry: current records, a global revision, a compactable change log
-- (the watch feed) and the full history of every record (audit and rollback).

CREATE TABLE registry_head (
    id               SMALLINT PRIMARY KEY CHECK (id = 1),
    -- Last committed revision. Writers lock this row, so revisions are
    -- consecutive and commit in revision order.
    revision         BIGINT NOT NULL CHECK (revision >= 0),
    -- Change-log rows at or below this revision were compacted away.
    compaction_floor BIGINT NOT NULL CHECK (compaction_floor >= 0)
);
INSERT INTO registry_head (id, revision, compaction_floor) VALUES (1, 0, 0);

CREATE TABLE mcp_servers (
    server_id     TEXT PRIMARY KEY,
    spec          JSONB NOT NULL,
    revision      BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    updated_by    TEXT NOT NULL,
    source        TEXT NOT NULL
);

CREATE TABLE mcp_server_changes (
    revision  BIGINT PRIMARY KEY,
    server_id TEXT NOT NULL,
    kind      TEXT NOT NULL CHECK (kind IN ('upsert', 'delete')),
    at_ms     BIGINT NOT NULL,
    actor     TEXT NOT NULL
);

CREATE TABLE mcp_server_history (
    server_id TEXT NOT NULL,
    revision  BIGINT NOT NULL,
    kind      TEXT NOT NULL CHECK (kind IN ('upsert', 'delete')),
    spec      JSONB,
    at_ms     BIGINT NOT NULL,
    actor     TEXT NOT NULL,
    source    TEXT NOT NULL,
    PRIMARY KEY (server_id, revision)
);

-- Wake every registry replica sharing this database (R-STORE-7). The payload
-- is only the revision; replicas read the change log themselves.
CREATE FUNCTION quiver_notify_change() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('quiver_registry_changes', NEW.revision::text);
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER mcp_server_changes_notify
    AFTER INSERT ON mcp_server_changes
    FOR EACH ROW EXECUTE FUNCTION quiver_notify_change();
