//! A request on an entry's connection within the server's budgets: the one
//! path of a `tools/call` ([`McpPool::call_tool_with`]), and every other
//! request forwarded as it is ([`McpPool::forward`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use quiver_model::StoredServer;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, JsonObject, RequestMetaObject, ServerResult,
};
use rmcp::service::ServiceError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::entry::Entry;
use super::inner::McpPool;
use crate::connection::Connection;
use crate::error::McpError;
use crate::inflight::{Answer, InFlightCall};
use crate::leases::SessionKey;
use crate::output::{OutputSize, enforce_cap};
use crate::relay::CallAttachment;

/// A finished `tools/call`.
#[derive(Debug, Clone)]
pub struct CallOutcome {
    /// The server's result, with the output cap applied.
    pub result: CallToolResult,
    /// Output size before and after the cap.
    pub output: OutputSize,
    /// Time spent, queueing included.
    pub duration: Duration,
}

/// Why a forwarded request failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ForwardError {
    /// The server answered with a JSON-RPC error, passed on as it is.
    #[error("server error {}: {}", .0.code.0, .0.message)]
    Server(rmcp::model::ErrorData),
    /// The request did not get an answer (or not one that may be passed on).
    #[error(transparent)]
    Failed(#[from] McpError),
}

/// What a call carries besides its name and arguments.
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    /// The caller's `_meta`, passed on (protocol keys of the caller's own
    /// session and its progress token are not: see [`forwarded_meta`]).
    pub meta: Option<RequestMetaObject>,
    /// The caller, for the server's traffic about the call.
    pub attachment: Option<CallAttachment>,
    /// The caller's session: required by `isolation = "per_session"`
    /// servers, whose calls then run on the session's own connection (the
    /// caller's own: see [`SessionKey`]).
    pub session: Option<SessionKey>,
    /// What the caller answers to the server's `input_required` (a call
    /// repeated after [`McpError::InputRequired`]).
    pub input: Option<UpstreamInput>,
    /// The caller's principal (`key:<id>`, `oidc:<issuer>#<sub>`, …): a
    /// server whose OAuth connection is per user is called with that
    /// principal's own grant, on a connection of its own.
    pub principal: Option<String>,
    /// What the caller can be asked (elicitation, sampling, roots): told to
    /// a server spoken to in 2026-07-28 in the request's `_meta` instead of
    /// the worker's own capabilities, so it asks only what the caller can
    /// answer. `None`: the worker's.
    pub client_capabilities: Option<rmcp::model::ClientCapabilities>,
}

/// A repeated call's answers to a 2026-07-28 server's `input_required`:
/// sent upstream as the call's `inputResponses` and `requestState`.
#[derive(Debug, Clone, Default)]
pub struct UpstreamInput {
    /// The answers, by the keys of the server's `inputRequests`.
    pub responses: rmcp::model::InputResponses,
    /// The server's `requestState`, echoed unchanged.
    pub request_state: Option<String>,
}

/// The `_meta` sent upstream: the caller's, without the keys that describe
/// the caller's own session with the worker (`io.modelcontextprotocol/…`:
/// protocol version, capabilities) and without its progress token (rmcp
/// sends every request with a token of its own, mapped back by the relay).
/// Only the keys passed on are copied: a 2026-07-28 caller's `_meta` is
/// mostly its own client info and capabilities.
pub fn forwarded_meta(meta: &RequestMetaObject) -> Option<RequestMetaObject> {
    let kept: JsonObject = meta
        .0
        .0
        .iter()
        .filter(|(key, _)| is_forwarded_meta_key(key))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    (!kept.is_empty()).then_some(RequestMetaObject(rmcp::model::MetaObject(kept)))
}

/// Whether a caller's `_meta` key is passed on upstream (see
/// [`forwarded_meta`]).
pub fn is_forwarded_meta_key(key: &str) -> bool {
    key != "progressToken" && !key.starts_with("io.modelcontextprotocol/")
}

impl McpPool {
    /// [`call_tool_with`](Self::call_tool_with) for a call of nothing but
    /// a tool and its arguments, its `tool_timeout_ms` starting now.
    pub async fn call_tool(
        &self,
        server: &Arc<StoredServer>,
        tool: &str,
        arguments: Option<JsonObject>,
    ) -> Result<CallOutcome, McpError> {
        self.call_tool_with(
            server,
            tool,
            arguments,
            Instant::now(),
            CallOptions::default(),
        )
        .await
    }

    /// Calls a tool within the server's budgets: the worker-wide in-flight
    /// cap, the server's `max_concurrency` (held until the server is done
    /// with the call, see the crate's `inflight` module), `tool_timeout_ms` counted
    /// from `started` (resolving the tool counts against it too; a
    /// timed-out call is cancelled on the server) and
    /// `max_tool_output_bytes`. The caller's `_meta` is passed on and the
    /// server's traffic about the call relayed to the caller (`options`).
    pub async fn call_tool_with(
        &self,
        server: &Arc<StoredServer>,
        tool: &str,
        arguments: Option<JsonObject>,
        started: Instant,
        options: CallOptions,
    ) -> Result<CallOutcome, McpError> {
        let entry = self
            .call_entry(
                server,
                options.session.as_ref(),
                options.principal.as_deref(),
            )
            .await?;
        let budgets = entry.server.load().spec.budgets;
        let timeout = Duration::from_millis(budgets.tool_timeout_ms);
        let server_id = entry.server_id();
        let result = async {
            // A second attempt only for a call that never reached the
            // server: its connection's OAuth grant changed (see below).
            let mut attempts = 0;
            loop {
                attempts += 1;
                // Waiting for room counts against the same budget as the call.
                let permits = tokio::time::timeout(
                    timeout,
                    acquire_both(&self.inner.inflight, &entry.calls.load_full(), &server_id),
                )
                .await
                .map_err(|_| {
                    McpError::Unavailable(format!(
                        "no call slot within {} ms (max_concurrency = {})",
                        budgets.tool_timeout_ms, budgets.max_concurrency
                    ))
                })??;
                let connection = self.connection(&entry).await?;
                entry.touch();
                let relayed = entry
                    .relay
                    .register(options.attachment.clone(), started + timeout);
                let mut params = CallToolRequestParams::new(tool.to_owned());
                params.arguments = arguments.clone();
                params.meta = options.meta.as_ref().and_then(forwarded_meta);
                if let Some(input) = &options.input {
                    params.input_responses =
                        (!input.responses.is_empty()).then(|| input.responses.clone());
                    params.request_state = input.request_state.clone();
                }
                let remaining = timeout.saturating_sub(started.elapsed());
                let grace = self.inner.options.cancel_grace;
                let answer = tokio::time::timeout(remaining, async {
                    // Only a 2026-07-28 request carries capabilities; a
                    // session's were the worker's, declared at `initialize`.
                    let caller_meta = options
                        .client_capabilities
                        .clone()
                        .filter(|_| {
                            connection.protocol_version().as_str()
                                >= rmcp::model::ProtocolVersion::V_2026_07_28.as_str()
                        })
                        .map(|capabilities| {
                            let mut meta = RequestMetaObject::new();
                            meta.set_client_capabilities(capabilities);
                            meta
                        });
                    match InFlightCall::send(
                        connection.clone(),
                        params,
                        permits,
                        grace,
                        caller_meta,
                    )
                    .await
                    {
                        Ok(call) => {
                            relayed.bind_progress(call.progress_token.clone());
                            call.answer(remaining).await
                        }
                        Err(err) => Some(Err(err)),
                    }
                })
                .await
                .ok()
                .flatten();
                drop(relayed);
                let Some(answer) = answer else {
                    break Err(McpError::Timeout(budgets.tool_timeout_ms));
                };
                let answer = answer.map_err(|err| {
                    crate::output::cap_service_error(err, budgets.max_tool_output_bytes as usize)
                });
                let outcome = self
                    .call_result(&entry, &connection, answer, budgets.tool_timeout_ms)
                    .await;
                // The OAuth connection got a new grant (a person consented
                // again) while this call was on its way: the connection
                // refused to send it with the new grant's token (the server
                // never ran it) and is closed; a new one carries the call.
                if outcome.is_err() && attempts == 1 && connection.grant_changed() {
                    continue;
                }
                break outcome;
            }
        }
        .await;
        let duration = started.elapsed();
        match result {
            Ok(mut result) => {
                let output = enforce_cap(&mut result, budgets.max_tool_output_bytes as usize);
                entry.answered(duration, true);
                if output.truncated() {
                    metrics::counter!("mcp_tool_output_truncated_total", "server_id" => server_id.clone(), "tool" => tool.to_owned())
                        .increment(1);
                }
                metrics::histogram!("mcp_tool_call_output_bytes", "server_id" => server_id, "tool" => tool.to_owned())
                    .record(output.original as f64);
                Ok(CallOutcome {
                    result,
                    output,
                    duration,
                })
            }
            // The server answered: asking for input is no failure of it.
            Err(err @ McpError::InputRequired(_)) => {
                entry.answered(duration, false);
                Err(err)
            }
            Err(err) => {
                entry.call_failed(&err);
                Err(err)
            }
        }
    }

    /// Sends any other request to the server (resources, prompts,
    /// completions, subscriptions, log level) and returns its answer as it
    /// is (a per-session server answers on `session`'s connection): within the worker-wide in-flight cap, `tool_timeout_ms` (a
    /// request out of time is cancelled on the server) and, for the answer,
    /// `max_tool_output_bytes`. A JSON-RPC error of the server is returned
    /// as the server sent it. What the server asks while it answers
    /// (elicitation, sampling, roots) goes to `attachment`'s caller, as for
    /// a call; the request counts as in flight for the relay either way, so
    /// nothing it causes reaches another caller.
    pub async fn forward<T, F, Fut>(
        &self,
        server: &Arc<StoredServer>,
        session: Option<&SessionKey>,
        principal: Option<&str>,
        attachment: Option<CallAttachment>,
        request: F,
    ) -> Result<T, ForwardError>
    where
        T: serde::Serialize,
        F: FnOnce(rmcp::service::Peer<rmcp::RoleClient>) -> Fut,
        Fut: std::future::Future<Output = Result<T, ServiceError>>,
    {
        let started = Instant::now();
        let entry = self.call_entry(server, session, principal).await?;
        let budgets = entry.server.load().spec.budgets;
        let timeout = Duration::from_millis(budgets.tool_timeout_ms);
        let answer = tokio::time::timeout(timeout, async {
            let _permit = self
                .inner
                .inflight
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| McpError::Unavailable("worker is shutting down".into()))?;
            let connection = self.connection(&entry).await?;
            entry.touch();
            let _relayed = entry.relay.register(attachment, started + timeout);
            // Dropping the request on timeout sends `notifications/cancelled`.
            let answer = request(connection.peer().clone()).await;
            if answer.is_err() {
                self.inner.forget_if_closed(&entry, connection).await;
            }
            Ok::<_, McpError>(answer)
        })
        .await
        .map_err(|_| McpError::Timeout(budgets.tool_timeout_ms))??;
        let result = match answer {
            Ok(result) => result,
            Err(ServiceError::McpError(error))
                if crate::dropped::dropped_answer(&error).is_none() =>
            {
                return Err(ForwardError::Server(error));
            }
            Err(err) => return Err(map_service_error(err, budgets.tool_timeout_ms).into()),
        };
        let size = crate::output::json_len(&result);
        let max = budgets.max_tool_output_bytes as usize;
        if size > max {
            return Err(McpError::OutputTooLarge(format!(
                "the answer is {size} bytes, over max_tool_output_bytes ({max})"
            ))
            .into());
        }
        entry.answered(started.elapsed(), false);
        Ok(result)
    }

    /// The result of an answered call; a connection found closed is
    /// forgotten, and errors name why the worker closed it, if it did.
    async fn call_result(
        &self,
        entry: &Entry,
        connection: &Arc<Connection>,
        answer: Answer,
        timeout_ms: u64,
    ) -> Result<CallToolResult, McpError> {
        let err = match answer {
            Ok(ServerResult::CallToolResult(result)) => return Ok(result),
            // Results without content (an empty result) are valid answers.
            Ok(ServerResult::EmptyResult(_)) => return Ok(CallToolResult::default()),
            // A 2026-07-28 server's request for input, for the caller to
            // answer by repeating the call (see [`UpstreamInput`]).
            Ok(ServerResult::InputRequiredResult(result)) => {
                return Err(McpError::InputRequired(Box::new(result)));
            }
            Ok(_) => ServiceError::UnexpectedResponse,
            Err(err) => err,
        };
        let err = match connection.recycled() {
            Some(reason) => McpError::Unavailable(format!("connection recycled: {reason}")),
            None => map_service_error(err, timeout_ms),
        };
        self.inner.forget_if_closed(entry, connection.clone()).await;
        Err(err)
    }
}

/// Takes the server's `max_concurrency` permit, then a worker-wide in-flight
/// permit, recording the wait for each in `mcp_semaphore_wait_ms`
/// (`semaphore` = `server` or `worker`). A wait cut short by the call's
/// timeout is not recorded (the call's error is counted instead).
async fn acquire_both(
    inflight: &Arc<Semaphore>,
    calls: &Arc<Semaphore>,
    server_id: &str,
) -> Result<(OwnedSemaphorePermit, OwnedSemaphorePermit), McpError> {
    let closed = |_| McpError::Unavailable("worker is shutting down".into());
    let waited = |started: Instant, semaphore: &'static str| {
        metrics::histogram!("mcp_semaphore_wait_ms", "server_id" => server_id.to_owned(), "semaphore" => semaphore)
            .record(started.elapsed().as_secs_f64() * 1000.0);
    };
    let started = Instant::now();
    let server = calls.clone().acquire_owned().await.map_err(closed)?;
    waited(started, "server");
    let started = Instant::now();
    let worker = inflight.clone().acquire_owned().await.map_err(closed)?;
    waited(started, "worker");
    Ok((server, worker))
}

/// Maps rmcp's errors to the §10 codes.
pub(super) fn map_service_error(err: ServiceError, timeout_ms: u64) -> McpError {
    if let ServiceError::McpError(error) = &err
        && let Some(dropped) = crate::dropped::dropped_answer(error)
    {
        return dropped;
    }
    match err {
        ServiceError::McpError(error) if error.code == rmcp::model::ErrorCode::INVALID_PARAMS => {
            McpError::InvalidArguments(error.message.to_string())
        }
        ServiceError::McpError(error)
            if error.code == rmcp::model::ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY =>
        {
            McpError::CapabilityRequired(Box::new(error))
        }
        ServiceError::McpError(error) => {
            McpError::Protocol(format!("server error {}: {}", error.code.0, error.message))
        }
        ServiceError::Timeout { .. } => McpError::Timeout(timeout_ms),
        ServiceError::TransportClosed => {
            McpError::Unavailable("connection to the server closed (it may have crashed)".into())
        }
        other => McpError::Unavailable(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_callers_own_keys_are_forwarded() {
        let mut meta = RequestMetaObject::new();
        meta.set_protocol_version(rmcp::model::ProtocolVersion::V_2026_07_28);
        meta.set_client_capabilities(rmcp::model::ClientCapabilities::default());
        meta.set_progress_token(rmcp::model::ProgressToken(
            rmcp::model::NumberOrString::Number(7),
        ));
        assert!(
            forwarded_meta(&meta).is_none(),
            "nothing of the caller's own"
        );
        meta.0
            .0
            .insert("trace".into(), serde_json::json!({"id": "t-1"}));
        let forwarded = forwarded_meta(&meta).expect("the caller's key");
        assert_eq!(
            serde_json::to_value(&forwarded).unwrap(),
            serde_json::json!({"trace": {"id": "t-1"}})
        );
    }
}
