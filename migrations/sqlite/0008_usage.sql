-- Fleet-wide rate limits and usage counts (docs/reference.md §12.5).
--
-- rate_windows: the current window of each rate-limit counter (a policy's
-- limit, per principal or per policy). A window opens at the first lease
-- after the previous one ended; `granted` counts the calls leased to
-- workers in it, returned ones subtracted, and never exceeds the limit.
-- `last_grant` is what the latest lease statement granted (read back by
-- that statement only). Windows that ended are purged by the registry.
CREATE TABLE rate_windows (
    limit_key       TEXT PRIMARY KEY,
    window_start_ms INTEGER NOT NULL,
    window_end_ms   INTEGER NOT NULL,
    granted         INTEGER NOT NULL,
    last_grant      INTEGER NOT NULL DEFAULT 0
);

CREATE INDEX rate_windows_end ON rate_windows (window_end_ms);

-- usage_minutes: calls per (minute, principal, policy, server, tool) as
-- workers report them; b00..b15 count calls per latency bucket
-- (quiver_model::usage::LATENCY_BOUNDS_MS). Kept for the registry's
-- usage retention (default 30 days).
CREATE TABLE usage_minutes (
    minute_ms    INTEGER NOT NULL,
    principal    TEXT NOT NULL,
    policy       TEXT NOT NULL,
    server_id    TEXT NOT NULL,
    tool         TEXT NOT NULL,
    calls        INTEGER NOT NULL,
    errors       INTEGER NOT NULL,
    rate_limited INTEGER NOT NULL,
    b00 INTEGER NOT NULL DEFAULT 0,
    b01 INTEGER NOT NULL DEFAULT 0,
    b02 INTEGER NOT NULL DEFAULT 0,
    b03 INTEGER NOT NULL DEFAULT 0,
    b04 INTEGER NOT NULL DEFAULT 0,
    b05 INTEGER NOT NULL DEFAULT 0,
    b06 INTEGER NOT NULL DEFAULT 0,
    b07 INTEGER NOT NULL DEFAULT 0,
    b08 INTEGER NOT NULL DEFAULT 0,
    b09 INTEGER NOT NULL DEFAULT 0,
    b10 INTEGER NOT NULL DEFAULT 0,
    b11 INTEGER NOT NULL DEFAULT 0,
    b12 INTEGER NOT NULL DEFAULT 0,
    b13 INTEGER NOT NULL DEFAULT 0,
    b14 INTEGER NOT NULL DEFAULT 0,
    b15 INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (minute_ms, principal, policy, server_id, tool)
);

-- usage_batches: the batches already added, so a worker repeating a batch
-- whose answer it lost is not counted twice. Kept a day.
CREATE TABLE usage_batches (
    source         TEXT NOT NULL,
    batch_id       INTEGER NOT NULL,
    received_at_ms INTEGER NOT NULL,
    PRIMARY KEY (source, batch_id)
);

CREATE INDEX usage_batches_received ON usage_batches (received_at_ms);
