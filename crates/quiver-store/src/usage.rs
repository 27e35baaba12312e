//! Fleet-wide rate-limit windows and usage counts (docs/reference.md §12.3).
//! Plain SQL both engines run unchanged, like `sessions`.
//!
//! A lease is two statements that are each atomic on the window's row, so
//! concurrent leases from any number of workers and registry replicas never
//! grant more than the limit: the first (re)opens the window when the last
//! one ended, the second takes what is left of it, at most the ask.

use chrono::Utc;
use quiver_model::usage::{LATENCY_BUCKETS, UsageCounts, UsageGroup, UsageTotal};
use sqlx::Row;
use std::sync::LazyLock;

use crate::error::StoreError;
use crate::sql::SqlStore;

/// At most this many rows one usage batch may add ([`crate::Store::record_usage`]).
pub const MAX_USAGE_BATCH_ROWS: usize = quiver_model::usage::MAX_BATCH_ROWS;

/// At most this many rows one usage query answers ([`crate::Store::usage`]).
pub const MAX_USAGE_ROWS: usize = 10_000;

/// Calls of a rate-limit window leased to a worker ([`crate::Store::lease_calls`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallsLease {
    /// Calls granted, at most the ask; 0 when the window is used up.
    pub granted: u32,
    /// The window they belong to (its start, milliseconds since the epoch);
    /// unused calls are given back to it.
    pub window_start_ms: i64,
    /// Milliseconds until the window ends.
    pub remaining_ms: i64,
}

/// Usage counts one worker reports at once ([`crate::Store::record_usage`]).
#[derive(Debug, Clone)]
pub struct UsageBatch {
    /// Who sends it (a worker instance).
    pub source: String,
    /// Its number at the source: a batch sent twice counts once.
    pub batch_id: u64,
    /// The counts, at most [`MAX_USAGE_BATCH_ROWS`].
    pub rows: Vec<(
        quiver_model::usage::UsageKey,
        quiver_model::usage::UsageCounts,
    )>,
}

/// $1 key, $2 now, $3 end of a new window. Opens the window, or reopens it
/// when it ended.
const OPEN_WINDOW: &str = "INSERT INTO rate_windows \
     (limit_key, window_start_ms, window_end_ms, granted, last_grant) VALUES ($1, $2, $3, 0, 0) \
     ON CONFLICT (limit_key) DO UPDATE SET window_start_ms = excluded.window_start_ms, \
     window_end_ms = excluded.window_end_ms, granted = 0, last_grant = 0 \
     WHERE rate_windows.window_end_ms <= $2";
/// $1 key, $2 ask, $3 limit. Grants what is left, at most the ask.
const TAKE: &str = "UPDATE rate_windows SET \
     last_grant = CASE WHEN granted + $2 <= $3 THEN $2 ELSE $3 - granted END, \
     granted = CASE WHEN granted + $2 <= $3 THEN granted + $2 ELSE $3 END \
     WHERE limit_key = $1 AND granted < $3 \
     RETURNING last_grant, window_start_ms, window_end_ms";
/// $1 key.
const WINDOW: &str = "SELECT window_start_ms, window_end_ms FROM rate_windows WHERE limit_key = $1";
/// $1 key, $2 window, $3 calls. Only into the same window, never below 0.
const GIVE_BACK: &str = "UPDATE rate_windows SET granted = granted - $3 \
     WHERE limit_key = $1 AND window_start_ms = $2 AND granted >= $3";
/// $1 source, $2 batch, $3 now.
const NOTE_BATCH: &str = "INSERT INTO usage_batches (source, batch_id, received_at_ms) \
     VALUES ($1, $2, $3) ON CONFLICT (source, batch_id) DO NOTHING";

fn bucket_columns() -> Vec<String> {
    (0..LATENCY_BUCKETS).map(|i| format!("b{i:02}")).collect()
}

/// Adds one row's counts: $1…$5 key, $6 calls, $7 errors, $8 rate_limited,
/// then the buckets.
static ADD_ROW: LazyLock<String> = LazyLock::new(|| {
    let buckets = bucket_columns();
    let values: Vec<String> = (0..LATENCY_BUCKETS)
        .map(|i| format!("${}", i + 9))
        .collect();
    let sums: Vec<String> = ["calls", "errors", "rate_limited"]
        .iter()
        .map(|c| c.to_string())
        .chain(buckets.iter().cloned())
        .map(|c| format!("{c} = usage_minutes.{c} + excluded.{c}"))
        .collect();
    format!(
        "INSERT INTO usage_minutes (minute_ms, principal, policy, server_id, tool, calls, errors, \
         rate_limited, {}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, {}) \
         ON CONFLICT (minute_ms, principal, policy, server_id, tool) DO UPDATE SET {}",
        buckets.join(", "),
        values.join(", "),
        sums.join(", ")
    )
});

fn group_columns(group: UsageGroup) -> &'static [&'static str] {
    match group {
        UsageGroup::Principal => &["principal"],
        UsageGroup::Policy => &["policy"],
        UsageGroup::Server => &["server_id"],
        UsageGroup::Tool => &["server_id", "tool"],
    }
}

/// $1 since, $2 until, $3 step (with a step). Sums are cast because
/// PostgreSQL sums BIGINT as NUMERIC.
fn totals_query(group: UsageGroup, stepped: bool) -> String {
    let keys = group_columns(group).join(", ");
    let time = if stepped {
        "(minute_ms / $3) * $3"
    } else {
        "0"
    };
    let sums: Vec<String> = ["calls", "errors", "rate_limited"]
        .iter()
        .map(|c| c.to_string())
        .chain(bucket_columns())
        .map(|c| format!("CAST(SUM({c}) AS BIGINT)"))
        .collect();
    // The calls column, by position: after the keys and the time.
    let calls = group_columns(group).len() + 2;
    format!(
        "SELECT {keys}, {time} AS t, {} FROM usage_minutes \
         WHERE minute_ms >= $1 AND minute_ms < $2 GROUP BY {keys}, t \
         ORDER BY t, {calls} DESC LIMIT {}",
        sums.join(", "),
        MAX_USAGE_ROWS + 1
    )
}

fn count(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl SqlStore {
    pub(crate) async fn usage_lease(
        &self,
        key: &str,
        limit: u32,
        per_s: u32,
        want: u32,
    ) -> Result<CallsLease, StoreError> {
        let now = Utc::now().timestamp_millis();
        let end = now + i64::from(per_s) * 1000;
        let (mut tx, _turn) = self.begin_write_tx().await?;
        sqlx::query(OPEN_WINDOW)
            .bind(key.to_owned())
            .bind(now)
            .bind(end)
            .execute(&mut *tx)
            .await?;
        let taken = sqlx::query(TAKE)
            .bind(key.to_owned())
            .bind(i64::from(want))
            .bind(i64::from(limit))
            .fetch_optional(&mut *tx)
            .await?;
        let (granted, start, end): (i64, i64, i64) = match taken {
            Some(row) => (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?),
            None => {
                let row = sqlx::query(WINDOW)
                    .bind(key.to_owned())
                    .fetch_one(&mut *tx)
                    .await?;
                (0, row.try_get(0)?, row.try_get(1)?)
            }
        };
        tx.commit().await?;
        // Read after the commit: a lease that took its time before another
        // opened the window would otherwise count from before the window
        // began, past its length. Clamped too, against a clock stepped back.
        let after = Utc::now().timestamp_millis();
        Ok(CallsLease {
            granted: u32::try_from(granted).unwrap_or(0),
            window_start_ms: start,
            remaining_ms: (end - after).clamp(0, i64::from(per_s) * 1000),
        })
    }

    pub(crate) async fn usage_give_back(
        &self,
        key: &str,
        window_start_ms: i64,
        calls: u32,
    ) -> Result<(), StoreError> {
        let (mut tx, _turn) = self.begin_write_tx().await?;
        sqlx::query(GIVE_BACK)
            .bind(key.to_owned())
            .bind(window_start_ms)
            .bind(i64::from(calls))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    pub(crate) async fn usage_record(&self, batch: &UsageBatch) -> Result<bool, StoreError> {
        if batch.rows.len() > MAX_USAGE_BATCH_ROWS {
            return Err(StoreError::Limit(format!(
                "at most {MAX_USAGE_BATCH_ROWS} usage rows per batch"
            )));
        }
        let (mut tx, _turn) = self.begin_write_tx().await?;
        let new = sqlx::query(NOTE_BATCH)
            .bind(batch.source.clone())
            .bind(signed(batch.batch_id))
            .bind(Utc::now().timestamp_millis())
            .execute(&mut *tx)
            .await?
            .rows_affected()
            == 1;
        if new {
            for (key, counts) in &batch.rows {
                let mut query = sqlx::query(ADD_ROW.as_str())
                    .bind(key.minute_ms)
                    .bind(key.principal.clone())
                    .bind(key.policy.clone())
                    .bind(key.server_id.clone())
                    .bind(key.tool.clone())
                    .bind(signed(counts.calls))
                    .bind(signed(counts.errors))
                    .bind(signed(counts.rate_limited));
                for bucket in counts.latency {
                    query = query.bind(signed(bucket));
                }
                query.execute(&mut *tx).await?;
            }
        }
        tx.commit().await?;
        Ok(new)
    }

    pub(crate) async fn usage_totals(
        &self,
        group: UsageGroup,
        since_ms: i64,
        until_ms: i64,
        step_ms: Option<i64>,
    ) -> Result<(Vec<UsageTotal>, bool), StoreError> {
        // Built from fixed column names only: no input reaches the text.
        let sql = sqlx::AssertSqlSafe(totals_query(group, step_ms.is_some()));
        let mut query = sqlx::query(sql).bind(since_ms).bind(until_ms);
        if let Some(step) = step_ms {
            query = query.bind(step);
        }
        let rows = query.fetch_all(self.pool()).await?;
        let keys = group_columns(group).len();
        let mut totals = Vec::with_capacity(rows.len().min(MAX_USAGE_ROWS));
        for row in rows.iter().take(MAX_USAGE_ROWS) {
            let key = (0..keys)
                .map(|i| row.try_get::<String, _>(i))
                .collect::<Result<Vec<_>, _>>()?;
            let time: i64 = row.try_get(keys)?;
            let at = |i: usize| row.try_get::<i64, _>(keys + 1 + i).map(count);
            let mut counts = UsageCounts {
                calls: at(0)?,
                errors: at(1)?,
                rate_limited: at(2)?,
                ..UsageCounts::default()
            };
            for (i, bucket) in counts.latency.iter_mut().enumerate() {
                *bucket = at(3 + i)?;
            }
            totals.push(UsageTotal {
                key,
                time_ms: step_ms.map(|_| time),
                counts,
            });
        }
        Ok((totals, rows.len() > MAX_USAGE_ROWS))
    }

    pub(crate) async fn usage_prune(&self, before_ms: i64) -> Result<u64, StoreError> {
        let now = Utc::now().timestamp_millis();
        let (mut tx, _turn) = self.begin_write_tx().await?;
        let mut pruned = sqlx::query("DELETE FROM usage_minutes WHERE minute_ms < $1")
            .bind(before_ms)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        pruned += sqlx::query("DELETE FROM usage_batches WHERE received_at_ms < $1")
            .bind(now - 86_400_000)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        pruned += sqlx::query("DELETE FROM rate_windows WHERE window_end_ms < $1")
            .bind(now)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(pruned)
    }
}
