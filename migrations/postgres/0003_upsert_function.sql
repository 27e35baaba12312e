-- One upsert in one statement (issue #16). The registry calls this function
-- instead of running BEGIN, a head lock, a read and four writes as separate
-- round trips, so `registry_head` stays locked only while the function runs
-- on the server and the commit flushes, not across six network round trips.
--
-- Why revisions stay consecutive (gap-free) and commit in revision order:
-- 1. A revision is only ever taken under the row lock of `registry_head`
--    (`FOR UPDATE` below), as `head + 1`, and written back to the head row in
--    the same transaction. The lock is held until that transaction commits or
--    rolls back, so no other writer can read the head in between: the next
--    writer reads the committed `head + 1` and takes `head + 2` (a rollback
--    leaves the head unchanged, so the revision is taken again: no gap).
-- 2. Because writer N+1 cannot take its revision before writer N has
--    committed, commits happen in revision order: whoever sees revision N+1
--    committed also sees every revision at or below N.
-- 3. Nothing is written before the lock: the checks that may end the call
--    early (identical content, revision conflict) only read, and they are
--    repeated under the lock with a fresh snapshot (READ COMMITTED takes one
--    per statement, after the lock was granted, so it sees every earlier
--    writer's commit). An early answer is one a caller could have got at the
--    moment of the unlocked read, and it takes no revision.
-- In a transaction that calls it several times (a batch), the first call
-- that writes takes the lock and every later call finds it held by its own
-- transaction: the batch takes one contiguous range of revisions.
--
-- Parameters: the record id, its JSON, the expected revision (NULL: none;
-- 0: must not exist), actor, source, whether that source adopts an identical
-- record (file sources: a move of ownership is a change) and the write time.
-- Returns one row: outcome ('created', 'updated', 'unchanged' or
-- 'conflict'), the record's revision (for 'conflict': the current one, 0 when
-- absent), created_at_ms, updated_at_ms, updated_by and source as stored.
CREATE FUNCTION quiver_upsert(
    p_server_id TEXT,
    p_spec JSONB,
    p_expected_revision BIGINT,
    p_actor TEXT,
    p_source TEXT,
    p_adopts_identical BOOLEAN,
    p_now_ms BIGINT
) RETURNS TABLE (
    outcome TEXT,
    revision BIGINT,
    created_at_ms BIGINT,
    updated_at_ms BIGINT,
    updated_by TEXT,
    source TEXT
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    cur mcp_servers%ROWTYPE;
    cur_found BOOLEAN;
    next_revision BIGINT;
    created BIGINT;
BEGIN
    -- Unlocked pre-check: decides no-ops and conflicts without waiting for
    -- the head lock (step 3 above).
    SELECT * INTO cur FROM mcp_servers s WHERE s.server_id = p_server_id;
    cur_found := FOUND;
    IF p_expected_revision IS NOT NULL
        AND p_expected_revision <> COALESCE(cur.revision, 0) THEN
        RETURN QUERY SELECT 'conflict'::TEXT, COALESCE(cur.revision, 0),
            cur.created_at_ms, cur.updated_at_ms, cur.updated_by, cur.source;
        RETURN;
    END IF;
    IF cur_found AND cur.spec = p_spec
        AND (cur.source = p_source OR NOT p_adopts_identical) THEN
        RETURN QUERY SELECT 'unchanged'::TEXT, cur.revision,
            cur.created_at_ms, cur.updated_at_ms, cur.updated_by, cur.source;
        RETURN;
    END IF;

    -- Critical section: from here to the commit of the calling transaction.
    SELECT h.revision + 1 INTO next_revision
        FROM registry_head h WHERE h.id = 1 FOR UPDATE;
    SELECT * INTO cur FROM mcp_servers s WHERE s.server_id = p_server_id;
    cur_found := FOUND;
    IF p_expected_revision IS NOT NULL
        AND p_expected_revision <> COALESCE(cur.revision, 0) THEN
        RETURN QUERY SELECT 'conflict'::TEXT, COALESCE(cur.revision, 0),
            cur.created_at_ms, cur.updated_at_ms, cur.updated_by, cur.source;
        RETURN;
    END IF;
    IF cur_found AND cur.spec = p_spec
        AND (cur.source = p_source OR NOT p_adopts_identical) THEN
        RETURN QUERY SELECT 'unchanged'::TEXT, cur.revision,
            cur.created_at_ms, cur.updated_at_ms, cur.updated_by, cur.source;
        RETURN;
    END IF;

    created := CASE WHEN cur_found THEN cur.created_at_ms ELSE p_now_ms END;
    INSERT INTO mcp_servers AS m
        (server_id, spec, revision, created_at_ms, updated_at_ms, updated_by, source)
        VALUES (p_server_id, p_spec, next_revision, created, p_now_ms, p_actor, p_source)
        ON CONFLICT (server_id) DO UPDATE SET spec = excluded.spec,
            revision = excluded.revision, created_at_ms = excluded.created_at_ms,
            updated_at_ms = excluded.updated_at_ms, updated_by = excluded.updated_by,
            source = excluded.source;
    UPDATE registry_head SET revision = next_revision WHERE id = 1;
    INSERT INTO mcp_server_changes (revision, server_id, kind, at_ms, actor)
        VALUES (next_revision, p_server_id, 'upsert', p_now_ms, p_actor);
    INSERT INTO mcp_server_history (server_id, revision, kind, spec, at_ms, actor, source)
        VALUES (p_server_id, next_revision, 'upsert', p_spec, p_now_ms, p_actor, p_source);
    RETURN QUERY SELECT CASE WHEN cur_found THEN 'updated' ELSE 'created' END,
        next_revision, created, p_now_ms, p_actor, p_source;
END;
$$;
