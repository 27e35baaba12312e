//! `GET /usage` (docs/reference.md §12.3): the usage workers reported,
//! totalled per principal, policy, server or tool over a period, optionally
//! in steps.

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use chrono::{DateTime, Utc};
use quiver_model::usage::{UsageGroup, UsageTotal, percentile};
use serde_json::{Map, Value, json};

use crate::error::RegistryError;
use crate::rest::extract::{Params, RequireViewer};
use crate::state::RegistryState;

/// The widest period `GET /admin/api/usage` answers, and its default.
const MAX_PERIOD_MS: i64 = 90 * 24 * 3600 * 1000;
const DEFAULT_PERIOD_MS: i64 = 24 * 3600 * 1000;

/// `GET /admin/api/usage`, merged into the admin API.
pub fn router() -> Router<RegistryState> {
    Router::new().route("/usage", get(usage))
}

/// A time parameter: RFC 3339 or milliseconds since the epoch.
fn instant(params: &Params, name: &str) -> Result<Option<i64>, RegistryError> {
    let Some(text) = params.0.get(name) else {
        return Ok(None);
    };
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(Some(ms));
    }
    DateTime::parse_from_rfc3339(text)
        .map(|at| Some(at.timestamp_millis()))
        .map_err(|_| {
            RegistryError::invalid(
                name,
                "must be an RFC 3339 time or milliseconds since the epoch",
            )
        })
}

fn rfc3339(ms: i64) -> Value {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map_or(Value::Null, |at| Value::String(at.to_rfc3339()))
}

fn key_names(group: UsageGroup) -> &'static [&'static str] {
    match group {
        UsageGroup::Principal => &["principal"],
        UsageGroup::Policy => &["policy"],
        UsageGroup::Server => &["server"],
        UsageGroup::Tool => &["server", "tool"],
    }
}

fn present(group: UsageGroup, total: UsageTotal) -> Value {
    let mut row = Map::new();
    for (name, value) in key_names(group).iter().zip(total.key) {
        row.insert((*name).to_owned(), Value::String(value));
    }
    if let Some(time) = total.time_ms {
        row.insert("time".into(), rfc3339(time));
    }
    let counts = total.counts;
    let ms = |q| percentile(&counts.latency, q).map(|ms| (ms * 1000.0).round() / 1000.0);
    row.insert("calls".into(), json!(counts.calls));
    row.insert("errors".into(), json!(counts.errors));
    row.insert("rate_limited".into(), json!(counts.rate_limited));
    row.insert("p50_ms".into(), json!(ms(0.5)));
    row.insert("p95_ms".into(), json!(ms(0.95)));
    Value::Object(row)
}

async fn usage(
    _caller: RequireViewer,
    State(state): State<RegistryState>,
    params: Params,
) -> Result<Response, RegistryError> {
    let group_text = params.0.get("group_by").map_or("server", String::as_str);
    let group = UsageGroup::parse(group_text).ok_or_else(|| {
        RegistryError::invalid("group_by", "must be principal, policy, server or tool")
    })?;
    let until = instant(&params, "until")?.unwrap_or_else(|| Utc::now().timestamp_millis());
    let since = instant(&params, "since")?.unwrap_or(until - DEFAULT_PERIOD_MS);
    if since >= until {
        return Err(RegistryError::invalid("since", "must be before until"));
    }
    if until - since > MAX_PERIOD_MS {
        return Err(RegistryError::invalid(
            "since",
            "the period is at most 90 days",
        ));
    }
    let step_s = match params.0.get("step_s") {
        None => None,
        Some(text) => match text.parse::<i64>() {
            Ok(step) if step >= 60 && step % 60 == 0 && step <= MAX_PERIOD_MS / 1000 => Some(step),
            _ => {
                return Err(RegistryError::invalid(
                    "step_s",
                    "must be a multiple of 60, at least 60",
                ));
            }
        },
    };
    let (totals, truncated) = state
        .store
        .usage(group, since, until, step_s.map(|s| s * 1000))
        .await?;
    let rows: Vec<Value> = totals.into_iter().map(|t| present(group, t)).collect();
    Ok(axum::Json(json!({
        "group_by": group_text,
        "since": rfc3339(since),
        "until": rfc3339(until),
        "step_s": step_s,
        "rows": rows,
        "truncated": truncated,
    }))
    .into_response())
}
