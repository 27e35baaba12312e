//! The automatic tool loop (R-CHAT-3, R-CHAT-4).
//!
//! Each model turn is classified by its tool calls:
//!
//! - no tool calls: the answer is final;
//! - only calls of the caller's own tools: returned to the caller unchanged;
//! - a mix of caller and MCP calls: returned to the caller with the MCP calls
//!   removed and none of them run (they are listed as `deferred`); the model
//!   asks for them again once the caller has answered its own calls, so no
//!   MCP side effect happens without the model seeing its result;
//! - only MCP calls: they run concurrently (within the servers' semaphores
//!   and timeouts), each answer goes back as a `role=tool` message with the
//!   call's id, and the model is asked again.
//!
//! Every name that is not one of the caller's tools is treated as an MCP
//! call and resolved only against this request's catalog, so an unknown,
//! malformed or denied name gets an `mcp_policy_denied` tool message and
//! never runs.
//!
//! Budgets: when `max_iterations` turns have run their calls, or
//! `max_total_tool_calls` calls have run, or `max_tool_output_bytes` of tool
//! output have been handed over, the next request is sent with
//! `tool_choice: "none"` so the model answers with what it has; MCP calls in
//! that final answer are removed and not run. Calls in one turn beyond the
//! call budget get an `mcp_budget_exceeded` tool message; a tool message
//! about a call that ran, output or error, is cut to what is left of the
//! byte budget and marked (see [`ToolMessage`]). `stop_reason` in the response's `mcp`
//! extension says which budget ended the loop.

use std::collections::HashSet;
use std::time::Instant;

use bytes::Bytes;
use quiver_mcp::McpError;
use quiver_model::budget::SessionBudgets;
use quiver_upstream::UpstreamError;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::approval::{ApprovalFlow, ApprovalSet};
use crate::auth::{CallerId, Task};
use crate::call::{Call, CallContext, CallError, Lookup, ToolRunner};
use crate::catalog::Catalog;
use crate::chat::body;
use crate::chat::search::ToolSearch;
use crate::chat::tool_message::ToolMessage;
use crate::chat::turn::{ModelToolCall, Turn};
use crate::chat::vision;

/// Produces the model's turns: whole completions or streamed ones.
pub trait TurnSource {
    /// Sends `body` upstream and returns the model's turn.
    fn next_turn(
        &mut self,
        body: Bytes,
    ) -> impl Future<Output = Result<Turn, UpstreamError>> + Send;
}

/// Why the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model answered without calling MCP tools.
    Completed,
    /// The model called the caller's own tools.
    CallerTools,
    /// `max_iterations` turns ran their MCP calls.
    MaxIterations,
    /// `max_total_tool_calls` MCP calls ran.
    MaxTotalToolCalls,
    /// `max_tool_output_bytes` of tool output were handed over.
    MaxToolOutputBytes,
    /// A call needs an approval: the pending ones are in `approvals`; send
    /// the conversation again with `mcp.approvals` once they are approved.
    ApprovalRequired,
    /// A call's server acts as each caller and this one has not connected
    /// its account: the links are in `authorizations`; send the
    /// conversation again once a person consented.
    AuthorizationRequired,
}

impl StopReason {
    fn budget_name(self) -> &'static str {
        match self {
            StopReason::MaxIterations => "max_iterations",
            StopReason::MaxTotalToolCalls => "max_total_tool_calls",
            StopReason::MaxToolOutputBytes => "max_tool_output_bytes",
            StopReason::Completed
            | StopReason::CallerTools
            | StopReason::ApprovalRequired
            | StopReason::AuthorizationRequired => "",
        }
    }
}

/// One MCP call the model asked for (run or not).
#[derive(Debug, Clone, Serialize)]
pub struct CallRecord {
    /// The model's `tool_call_id`.
    pub id: String,
    /// The function name the model used.
    pub name: String,
    /// The server, when the name resolved.
    pub server_id: Option<String>,
    /// The MCP tool, when the name resolved.
    pub tool: Option<String>,
    /// `ok`, a §10 code, or `deferred` (mixed turn, not run).
    pub status: &'static str,
    /// Time from the turn's answer to this call's result.
    pub duration_ms: f64,
    /// The 1-based model turn that asked for it.
    pub iteration: u32,
}

/// What the loop did (the `mcp` extension of the response).
#[derive(Debug, Clone, Serialize)]
pub struct LoopReport {
    /// Upstream requests made.
    pub iterations: u32,
    /// Why it ended.
    pub stop_reason: StopReason,
    /// Every MCP call asked for.
    pub calls: Vec<CallRecord>,
    /// Selected servers whose tools could not be offered, with why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<Value>,
    /// With `approval_required`: the approvals requested, `{approval_id,
    /// name, arguments}`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<Value>,
    /// With `authorization_required`: where the caller's person consents,
    /// `{oauth_connection, authorization_url, name}` per connection.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub authorizations: Vec<Value>,
    /// Token usage summed over the upstream requests.
    #[serde(skip)]
    pub usage: Option<Value>,
}

/// Everything one loop needs.
pub struct ToolLoop<'a> {
    /// Runs the calls.
    pub runner: &'a ToolRunner,
    /// The caller's task.
    pub task: &'a Task,
    /// Request and session ids.
    pub context: &'a CallContext,
    /// The MCP tools of this request.
    pub catalog: &'a Catalog,
    /// With tool search: what is offered, and the search the model calls.
    pub search: Option<&'a ToolSearch>,
    /// Names of the caller's own tools.
    pub caller_tools: &'a HashSet<String>,
    /// `mcp.vision`: images of results go to the model too.
    pub vision: bool,
    /// Session budgets.
    pub budgets: SessionBudgets,
    /// `mcp.approvals` of the request, each used once by this loop.
    pub approvals: ApprovalSet,
}

impl ToolLoop<'_> {
    /// Runs the loop over `body` (whose `messages` grows) and returns the
    /// final turn, MCP calls removed, and the report.
    pub async fn run(
        &self,
        body: &mut Map<String, Value>,
        source: &mut impl TurnSource,
    ) -> Result<(Turn, LoopReport), UpstreamError> {
        let mut report = LoopReport {
            iterations: 0,
            stop_reason: StopReason::Completed,
            calls: Vec::new(),
            unavailable: self
                .catalog
                .unavailable
                .iter()
                .map(|u| {
                    let mut entry = json!({"server_id": u.server_id, "error": u.error.to_string()});
                    // A server listed for nobody yet: the caller's link still
                    // reaches it.
                    if let McpError::AuthorizationRequired(required) = &u.error {
                        entry["authorization_url"] = json!(required.url);
                    }
                    entry
                })
                .collect(),
            approvals: Vec::new(),
            authorizations: Vec::new(),
            usage: None,
        };
        let mut rounds = 0u32;
        let mut calls_run = 0u32;
        let mut output_bytes = 0u64;
        let mut exhausted: Option<StopReason> = None;
        loop {
            let encoded = match self.search {
                Some(search) => body::encode(body, search.functions(self.catalog).into_iter()),
                None => body::encode(body, self.catalog.functions()),
            }
            .map_err(|err| UpstreamError::InvalidResponse(err.to_string()))?;
            let mut turn = source.next_turn(Bytes::from(encoded)).await?;
            report.iterations += 1;
            if let Some(usage) = &turn.usage {
                add_usage(&mut report.usage, usage);
            }
            let iteration = report.iterations;
            let calls = turn.tool_calls()?;
            let (mcp_calls, caller_calls): (Vec<_>, Vec<_>) = calls
                .into_iter()
                .partition(|call| !self.caller_tools.contains(&call.name));
            if mcp_calls.is_empty() {
                report.stop_reason = exhausted.unwrap_or(if caller_calls.is_empty() {
                    StopReason::Completed
                } else {
                    StopReason::CallerTools
                });
                return Ok((turn, report));
            }
            if !caller_calls.is_empty() || exhausted.is_some() {
                for call in &mcp_calls {
                    report
                        .calls
                        .push(self.record(call, "deferred", 0.0, iteration));
                }
                turn.retain_tool_calls(|name| self.caller_tools.contains(name));
                if !turn.message.contains_key("tool_calls") && turn.finish_reason == "tool_calls" {
                    turn.finish_reason = Value::String("stop".into());
                }
                report.stop_reason = exhausted.unwrap_or(StopReason::CallerTools);
                return Ok((turn, report));
            }

            // Calls the caller must first connect its account for stop the
            // loop before anything of the turn runs.
            let consents = self.needed_consents(&mcp_calls).await;
            if !consents.is_empty() {
                report.authorizations = consents;
                self.stop_before_running(
                    &mut turn,
                    &mut report,
                    &mcp_calls,
                    iteration,
                    StopReason::AuthorizationRequired,
                );
                return Ok((turn, report));
            }

            // Calls that need an approval stop the loop before anything of
            // the turn runs, unless the caller brought approvals.
            let pending = self.request_approvals(&mcp_calls).await;
            if !pending.is_empty() {
                report.approvals = pending;
                self.stop_before_running(
                    &mut turn,
                    &mut report,
                    &mcp_calls,
                    iteration,
                    StopReason::ApprovalRequired,
                );
                return Ok((turn, report));
            }

            rounds += 1;
            let allowed_calls = self.budgets.max_total_tool_calls.saturating_sub(calls_run);
            let answered = self.run_calls(&mcp_calls, allowed_calls).await;
            let mut messages = Vec::with_capacity(answered.len());
            let mut images = Vec::new();
            for (call, (answer, duration_ms)) in mcp_calls.iter().zip(answered) {
                let remaining = self
                    .budgets
                    .max_tool_output_bytes
                    .saturating_sub(output_bytes);
                let message = match answer {
                    // A call that ran is reported even with no budget left:
                    // the model must not believe it did not run.
                    Answer::Done(done) => {
                        if self.vision {
                            images.extend(vision::message(
                                self.runner.artifacts(),
                                self.context.artifacts_owner.clone(),
                                &call.id,
                                &done.artifacts,
                            ));
                        }
                        ToolMessage::output(&done, remaining)
                    }
                    Answer::Searched(content) => ToolMessage {
                        output_bytes: content.len() as u64,
                        content,
                        status: "ok",
                    },
                    Answer::Failed(err) => ToolMessage::error(&err, remaining),
                    Answer::OverBudget => ToolMessage::budget_exceeded("max_total_tool_calls"),
                };
                output_bytes += message.output_bytes;
                report
                    .calls
                    .push(self.record(call, message.status, duration_ms, iteration));
                messages.push(json!({
                    "role": "tool",
                    "tool_call_id": call.id,
                    "content": message.content,
                }));
            }
            calls_run += mcp_calls.len().min(allowed_calls as usize) as u32;
            let history = match body.get_mut("messages") {
                Some(Value::Array(history)) => history,
                _ => return Err(UpstreamError::InvalidResponse("messages vanished".into())),
            };
            history.push(Value::Object(turn.message));
            history.extend(messages);
            history.extend(images);

            // A forced choice applies to the caller's request, not to every
            // follow-up: forcing it again would loop until a budget ends it.
            if matches!(body.get("tool_choice"), Some(Value::Object(_)))
                || body.get("tool_choice").and_then(Value::as_str) == Some("required")
            {
                body.insert("tool_choice".into(), Value::String("auto".into()));
            }
            exhausted = if rounds >= self.budgets.max_iterations {
                Some(StopReason::MaxIterations)
            } else if calls_run >= self.budgets.max_total_tool_calls {
                Some(StopReason::MaxTotalToolCalls)
            } else if output_bytes >= self.budgets.max_tool_output_bytes {
                Some(StopReason::MaxToolOutputBytes)
            } else {
                None
            };
            if let Some(reason) = exhausted {
                metrics::counter!("mcp_session_budget_exceeded_total", "budget" => reason.budget_name())
                    .increment(1);
                body.insert("tool_choice".into(), Value::String("none".into()));
            }
        }
    }

    fn record(
        &self,
        call: &ModelToolCall,
        status: &'static str,
        duration_ms: f64,
        iteration: u32,
    ) -> CallRecord {
        let tool = self.catalog.resolve(&call.name);
        CallRecord {
            id: call.id.clone(),
            name: call.name.clone(),
            server_id: tool.map(|t| t.server_id().to_owned()),
            tool: tool.map(|t| t.tool_name().to_owned()),
            status,
            duration_ms,
            iteration,
        }
    }

    /// Without `mcp.approvals`, requests an approval for each call that needs
    /// one; returns those requested (`{approval_id, name, arguments}`). A
    /// call whose approval cannot be requested is left to its run, which
    /// refuses it with the reason.
    /// Ends the loop at `turn` without running its MCP calls, which are
    /// reported as `reason` (`approval_required`, `authorization_required`);
    /// the caller's own calls stay in the turn.
    fn stop_before_running(
        &self,
        turn: &mut Turn,
        report: &mut LoopReport,
        calls: &[ModelToolCall],
        iteration: u32,
        reason: StopReason,
    ) {
        let status = match reason {
            StopReason::AuthorizationRequired => "authorization_required",
            _ => "approval_required",
        };
        for call in calls {
            report.calls.push(self.record(call, status, 0.0, iteration));
        }
        turn.retain_tool_calls(|name| self.caller_tools.contains(name));
        if turn.finish_reason == "tool_calls" {
            turn.finish_reason = Value::String("stop".into());
        }
        report.stop_reason = reason;
    }

    /// The consents the caller still has to give for `calls` (servers whose
    /// OAuth connection is per user), one per connection.
    async fn needed_consents(&self, calls: &[ModelToolCall]) -> Vec<Value> {
        let principal = self
            .context
            .caller
            .as_ref()
            .and_then(CallerId::grant_principal);
        let mut needed: Vec<Value> = Vec::new();
        for call in calls {
            let Some(tool) = self.catalog.resolve(&call.name) else {
                continue;
            };
            let Err(McpError::AuthorizationRequired(required)) = self
                .runner
                .pool()
                .check_grant(&tool.server, principal.as_deref())
                .await
            else {
                continue;
            };
            if needed
                .iter()
                .all(|known| known["oauth_connection"] != required.connection.as_str())
            {
                needed.push(json!({
                    "oauth_connection": required.connection,
                    "authorization_url": required.url,
                    "name": call.name,
                }));
            }
        }
        needed
    }

    async fn request_approvals(&self, calls: &[ModelToolCall]) -> Vec<Value> {
        if !self.approvals.is_empty() {
            return Vec::new();
        }
        let mut pending = Vec::new();
        for call in calls {
            let Some(tool) = self.catalog.resolve(&call.name) else {
                continue;
            };
            if !tool.needs_approval() {
                continue;
            }
            if let Ok(id) = self
                .runner
                .request_approval(
                    self.task,
                    self.context.caller.as_ref(),
                    tool,
                    Some(call.arguments.clone()),
                )
                .await
            {
                pending.push(
                    json!({"approval_id": id, "name": call.name, "arguments": call.arguments}),
                );
            }
        }
        pending
    }

    /// Runs the first `allowed` calls concurrently; the rest are over
    /// budget. Durations are from the turn's answer to each result.
    async fn run_calls(&self, calls: &[ModelToolCall], allowed: u32) -> Vec<(Answer, f64)> {
        let started = Instant::now();
        let runs = calls.iter().enumerate().map(|(i, call)| async move {
            if i as u64 >= u64::from(allowed) {
                return (Answer::OverBudget, 0.0);
            }
            if let Some(search) = self.search
                && ToolSearch::is_search(&call.name)
            {
                let elapsed = started.elapsed().as_secs_f64() * 1000.0;
                return match search.answer(self.catalog, &call.arguments) {
                    Ok(content) => (Answer::Searched(content), elapsed),
                    Err(err) => (Answer::Failed(err), elapsed),
                };
            }
            // Without `mcp.approvals` the turn stopped before any call that
            // needs one could run (`request_approvals`).
            let approval = if self.approvals.is_empty() {
                ApprovalFlow::Refuse
            } else {
                ApprovalFlow::FirstOf(&self.approvals)
            };
            let result = self
                .runner
                .call(
                    self.task,
                    self.context,
                    Call {
                        name: &call.name,
                        arguments: Some(call.arguments.clone()),
                        lookup: Lookup::In(self.catalog),
                        approval,
                    },
                )
                .await;
            let elapsed = started.elapsed().as_secs_f64() * 1000.0;
            match result {
                Ok(done) => (Answer::Done(Box::new(done)), elapsed),
                Err(err) => (Answer::Failed(err), elapsed),
            }
        });
        futures::future::join_all(runs).await
    }
}

/// The outcome of one MCP call of a turn.
enum Answer {
    Done(Box<crate::call::CallDone>),
    /// The answer of a tool search call.
    Searched(String),
    Failed(CallError),
    OverBudget,
}

/// Adds `usage` into `total`, field by field (nested details included).
pub fn add_usage(total: &mut Option<Value>, usage: &Value) {
    match total {
        None => *total = Some(usage.clone()),
        Some(total) => add_values(total, usage),
    }
}

fn add_values(total: &mut Value, add: &Value) {
    match (total, add) {
        (Value::Object(total), Value::Object(add)) => {
            for (key, value) in add {
                match total.get_mut(key) {
                    Some(existing) => add_values(existing, value),
                    None => {
                        total.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (total @ Value::Number(_), Value::Number(add)) => {
            let sum = match (total.as_u64(), add.as_u64()) {
                (Some(a), Some(b)) => json!(a.saturating_add(b)),
                _ => json!(total.as_f64().unwrap_or(0.0) + add.as_f64().unwrap_or(0.0)),
            };
            *total = sum;
        }
        (total, add) if total.is_null() => *total = add.clone(),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_adds_up_field_by_field() {
        let mut total = None;
        add_usage(
            &mut total,
            &json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
                    "prompt_tokens_details": {"cached_tokens": 2}}),
        );
        add_usage(
            &mut total,
            &json!({"prompt_tokens": 20, "completion_tokens": 1, "total_tokens": 21,
                    "prompt_tokens_details": {"cached_tokens": 3, "audio_tokens": 1}, "cost": 0.5}),
        );
        assert_eq!(
            total.unwrap(),
            json!({"prompt_tokens": 30, "completion_tokens": 6, "total_tokens": 36,
                   "prompt_tokens_details": {"cached_tokens": 5, "audio_tokens": 1}, "cost": 0.5})
        );
    }
}
