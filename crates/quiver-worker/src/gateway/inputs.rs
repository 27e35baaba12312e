//! What a server asks during a 2026-07-28 client's request, turned into an
//! `input_required` result (MCP multi-round-trip requests).
//!
//! A client of 2026-07-28 has no session to take the server's requests
//! (`elicitation/create`, `sampling/createMessage`, `roots/list`) while its
//! call runs. So when a server asks during the call, the gateway stops the
//! call and answers the client `input_required` with the server's requests
//! as `inputRequests`; the client retries the same request with its answers
//! (`inputResponses`) and the gateway's `requestState`
//! ([`super::request_state`]). The retry runs the call again (on any
//! worker) and, as the server asks again, answers it from what the client
//! gave; a request asked for the first time ends the round again. The
//! answers used travel on in the state, so a third round still has the
//! first round's.
//!
//! An input's key is the server's own name for it when it gives one in
//! the request's `_meta` ([`INPUT_KEY_META`]), otherwise the kind of request
//! and a digest of what it asks: the same question asked again in the
//! retried call gets the same key, in whatever order the server asks.
//! Requests the server makes at the same time are gathered for
//! [`GATHER_WINDOW`], so the client answers them in one round.

// SEP-2577 deprecates sampling and roots; servers still ask for both.
#![expect(deprecated)]

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rmcp::model::{
    ClientCapabilities, CreateMessageRequestParams, CreateMessageResult, ElicitRequestParams,
    ElicitResult, ErrorCode as RpcCode, ErrorData, InputRequest, InputRequests, ListRootsResult,
    RequestMetaObject,
};
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

/// The `_meta` key a server may name its request's input with (a Quiver
/// convention; without it the key is derived from the request).
pub const INPUT_KEY_META: &str = "io.quiver/inputKey";

/// Longest input key taken from a server's `_meta`.
const MAX_INPUT_KEY_LEN: usize = 64;

/// How long the gateway waits, after a server's first unanswered request,
/// for the others it makes at the same time.
pub const GATHER_WINDOW: Duration = Duration::from_millis(50);

/// JSON-RPC code of a request the client's declared capabilities cannot
/// answer (2026-07-28 `MissingRequiredClientCapability`).
const MISSING_CAPABILITY: RpcCode = RpcCode(-32021);

/// The client's side of one round: the answers it gave and what the server
/// asked that it did not answer yet.
pub struct Inputs {
    /// The client's answers, from the state and this round's `inputResponses`.
    offered: BTreeMap<String, serde_json::Value>,
    /// What the client declared it can answer.
    capabilities: ClientCapabilities,
    round: Mutex<Round>,
    asked: Notify,
    /// Set when the round ended: requests left waiting are refused.
    over: AtomicBool,
    /// Wakes the requests left waiting when the round ends. (A flag and a
    /// `Notify` are all a round needs of a cancellation token, which is
    /// allocated, and locked again when dropped, on every request.)
    closed: Notify,
}

#[derive(Default)]
struct Round {
    /// Answers the server got this round (they go on in the state).
    used: BTreeMap<String, serde_json::Value>,
    /// Requests waiting for the client.
    pending: InputRequests,
    /// An answer of the client that is not an answer to what was asked.
    invalid: Option<ErrorData>,
    /// What the server asked for that the client did not declare.
    refused: ClientCapabilities,
}

/// How a round ended, when it did not end with the server's result.
pub enum RoundEnd {
    /// The server asked what the client has to answer first.
    InputRequired {
        /// The requests, by input key.
        requests: InputRequests,
        /// The answers used so far (for the next state).
        used: BTreeMap<String, serde_json::Value>,
    },
    /// One of the client's answers does not fit its request.
    Invalid(ErrorData),
}

/// The three requests a server can make of a client during a request.
#[derive(Debug, Clone, Copy)]
enum Asked {
    Elicitation,
    Sampling,
    Roots,
}

impl Asked {
    fn method(self) -> &'static str {
        match self {
            Asked::Elicitation => "elicitation/create",
            Asked::Sampling => "sampling/createMessage",
            Asked::Roots => "roots/list",
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Asked::Elicitation => "elicitation",
            Asked::Sampling => "sampling",
            Asked::Roots => "roots",
        }
    }

    /// Adds the capability this request needs to `capabilities`.
    fn require(self, capabilities: &mut ClientCapabilities) {
        match self {
            Asked::Elicitation => capabilities.elicitation = Some(Default::default()),
            Asked::Sampling => capabilities.sampling = Some(Default::default()),
            Asked::Roots => capabilities.roots = Some(Default::default()),
        }
    }

    fn declared(self, capabilities: &ClientCapabilities) -> bool {
        match self {
            Asked::Elicitation => capabilities.elicitation.is_some(),
            Asked::Sampling => capabilities.sampling.is_some(),
            Asked::Roots => capabilities.roots.is_some(),
        }
    }
}

impl Inputs {
    /// A round with the client's answers so far and its capabilities.
    pub fn new(
        offered: BTreeMap<String, serde_json::Value>,
        capabilities: ClientCapabilities,
    ) -> Self {
        Inputs {
            offered,
            capabilities,
            round: Mutex::default(),
            asked: Notify::new(),
            over: AtomicBool::new(false),
            closed: Notify::new(),
        }
    }

    /// What the client declared it can be asked.
    pub fn capabilities(&self) -> &ClientCapabilities {
        &self.capabilities
    }

    /// Whether the client declared it can be asked by elicitation.
    pub fn can_elicit(&self) -> bool {
        Asked::Elicitation.declared(&self.capabilities)
    }

    /// The client's answer under `key`, if it gave one.
    pub fn offered(&self, key: &str) -> Option<&serde_json::Value> {
        self.offered.get(key)
    }

    fn round(&self) -> std::sync::MutexGuard<'_, Round> {
        self.round.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `elicitation/create` of the server.
    pub async fn elicit(&self, params: ElicitRequestParams) -> Result<ElicitResult, ErrorData> {
        self.ask(Asked::Elicitation, serialized(&params)).await
    }

    /// `sampling/createMessage` of the server.
    pub async fn sample(
        &self,
        params: CreateMessageRequestParams,
    ) -> Result<CreateMessageResult, ErrorData> {
        self.ask(Asked::Sampling, serialized(&params)).await
    }

    /// `roots/list` of the server (its only params: `_meta`).
    pub async fn roots(
        &self,
        meta: Option<RequestMetaObject>,
    ) -> Result<ListRootsResult, ErrorData> {
        let params = match meta {
            Some(meta) => serde_json::json!({ "_meta": meta }),
            None => serde_json::json!({}),
        };
        self.ask(Asked::Roots, params).await
    }

    /// The client's answer to a request, or (the request waits) the round
    /// ends asking it.
    async fn ask<T: DeserializeOwned>(
        &self,
        asked: Asked,
        mut params: serde_json::Value,
    ) -> Result<T, ErrorData> {
        let key = input_key(asked, &mut params);
        if let Some(answer) = self.offered.get(&key) {
            return match serde_json::from_value::<T>(answer.clone()) {
                Ok(answer_of) => {
                    self.round().used.insert(key, answer.clone());
                    Ok(answer_of)
                }
                Err(err) => {
                    let error = ErrorData::invalid_params(
                        format!(
                            "inputResponses[{key:?}] is not an answer to {}: {err}",
                            asked.method()
                        ),
                        None,
                    );
                    self.round().invalid = Some(error.clone());
                    self.asked.notify_one();
                    Err(error)
                }
            };
        }
        if !asked.declared(&self.capabilities) {
            asked.require(&mut self.round().refused);
            // The server hears why, and may go on without it.
            return Err(ErrorData::new(
                MISSING_CAPABILITY,
                format!(
                    "the client did not declare the {} capability, so it cannot be asked {}",
                    asked.kind(),
                    asked.method()
                ),
                None,
            ));
        }
        let request: InputRequest = serde_json::from_value(serde_json::json!({
            "method": asked.method(),
            "params": params,
        }))
        .map_err(|err| {
            ErrorData::invalid_params(format!("{} request: {err}", asked.method()), None)
        })?;
        self.round().pending.insert(key, request);
        self.asked.notify_one();
        self.round_over().await;
        Err(ErrorData::internal_error(
            "the client is asked for this input; the request is sent again with its answer",
            None,
        ))
    }

    /// Ends the round when the server asked what the client has not
    /// answered (after [`GATHER_WINDOW`], for what it asks alongside) or
    /// an answer does not fit; pending until then.
    pub async fn ended(&self) -> RoundEnd {
        loop {
            let asked = self.asked.notified();
            {
                let round = self.round();
                if let Some(invalid) = &round.invalid {
                    return RoundEnd::Invalid(invalid.clone());
                }
                if !round.pending.is_empty() {
                    break;
                }
            }
            asked.await;
        }
        tokio::time::sleep(GATHER_WINDOW).await;
        self.end_round();
        let mut round = self.round();
        if let Some(invalid) = round.invalid.take() {
            return RoundEnd::Invalid(invalid);
        }
        RoundEnd::InputRequired {
            requests: std::mem::take(&mut round.pending),
            used: std::mem::take(&mut round.used),
        }
    }

    /// Resolves once the round ended.
    async fn round_over(&self) {
        loop {
            // Made before the flag is read: `notify_waiters` wakes it even
            // if the round ends between the two.
            let closed = self.closed.notified();
            if self.over.load(Ordering::Acquire) {
                return;
            }
            closed.await;
        }
    }

    fn end_round(&self) {
        self.over.store(true, Ordering::Release);
        self.closed.notify_waiters();
    }

    /// The error a request that failed gets when its server asked for what
    /// the client did not declare: the failure is the missing capability's
    /// (-32021 naming it), not the server's.
    pub fn missing_capability(&self) -> Option<ErrorData> {
        let refused = self.round().refused.clone();
        (refused != ClientCapabilities::default())
            .then(|| ErrorData::missing_required_client_capability(refused))
    }

    /// The answers the server used (when the request completes anyway,
    /// nothing goes on: kept for a request that ends for approval).
    pub fn used(&self) -> BTreeMap<String, serde_json::Value> {
        self.round().used.clone()
    }
}

fn serialized(params: &impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(params).unwrap_or(serde_json::Value::Null)
}

/// The key of a request: the server's name for it (taken out of its
/// `_meta`), or `<kind>-<digest of what it asks>`.
fn input_key(asked: Asked, params: &mut serde_json::Value) -> String {
    let named = params
        .get_mut("_meta")
        .and_then(|meta| meta.as_object_mut())
        .and_then(|meta| meta.remove(INPUT_KEY_META))
        .and_then(|key| key.as_str().map(str::to_owned))
        .filter(|key| {
            !key.is_empty()
                && key.len() <= MAX_INPUT_KEY_LEN
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        });
    if let Some(meta) = params.get("_meta").and_then(|meta| meta.as_object())
        && meta.is_empty()
        && let Some(object) = params.as_object_mut()
    {
        object.remove("_meta");
    }
    named.unwrap_or_else(|| {
        let digest = Sha256::digest(params.to_string().as_bytes());
        let short = hex::encode(&digest[..6]);
        format!("{}-{short}", asked.kind())
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    fn elicitation(message: &str, key: Option<&str>) -> ElicitRequestParams {
        let mut params = json!({
            "message": message,
            "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}},
        });
        if let Some(key) = key {
            params["_meta"] = json!({ INPUT_KEY_META: key });
        }
        serde_json::from_value(params).expect("elicitation params")
    }

    fn all_capabilities() -> ClientCapabilities {
        serde_json::from_value(json!({"elicitation": {}, "sampling": {}, "roots": {}}))
            .expect("capabilities")
    }

    #[tokio::test]
    async fn an_unanswered_request_ends_the_round_with_every_request_asked_alongside() {
        let inputs = Arc::new(Inputs::new(BTreeMap::new(), all_capabilities()));
        let first = tokio::spawn({
            let inputs = inputs.clone();
            async move { inputs.elicit(elicitation("name?", Some("user_name"))).await }
        });
        let second = tokio::spawn({
            let inputs = inputs.clone();
            async move { inputs.roots(None).await }
        });
        let RoundEnd::InputRequired { requests, used } = inputs.ended().await else {
            panic!("the round ends asking");
        };
        assert!(used.is_empty());
        let keys: Vec<&String> = requests.keys().collect();
        assert_eq!(keys.len(), 2, "{keys:?}");
        assert!(requests.contains_key("user_name"));
        assert!(keys.iter().any(|key| key.starts_with("roots-")));
        // The server's own key is not passed on to the client.
        let asked = serde_json::to_value(&requests["user_name"]).unwrap();
        assert_eq!(asked["method"], "elicitation/create");
        assert!(asked["params"].get("_meta").is_none(), "{asked}");
        // Requests left waiting are refused once the round ended.
        assert!(first.await.unwrap().is_err());
        assert!(second.await.unwrap().is_err());
    }

    #[tokio::test]
    async fn answers_are_used_by_key_and_derived_keys_are_stable() {
        let mut key = json!({"message": "Age?", "requestedSchema": {"type": "object"}});
        let derived = input_key(Asked::Elicitation, &mut key);
        assert_eq!(
            derived,
            input_key(Asked::Elicitation, &mut key.clone()),
            "the same question gets the same key"
        );
        let answer = json!({"action": "accept", "content": {"name": "Alice"}});
        let inputs = Inputs::new(
            BTreeMap::from([
                ("user_name".to_owned(), answer.clone()),
                ("extra".to_owned(), json!(1)),
            ]),
            ClientCapabilities::default(),
        );
        let answered = inputs
            .elicit(elicitation("name?", Some("user_name")))
            .await
            .expect("answered from inputResponses");
        assert_eq!(serde_json::to_value(answered).unwrap(), answer);
        assert_eq!(
            inputs.used(),
            BTreeMap::from([("user_name".to_owned(), answer)])
        );
    }

    #[tokio::test]
    async fn an_answer_of_the_wrong_shape_ends_the_round_invalid_and_undeclared_requests_are_refused()
     {
        let inputs = Inputs::new(
            BTreeMap::from([("user_name".to_owned(), json!("yes"))]),
            ClientCapabilities::default(),
        );
        assert!(
            inputs
                .elicit(elicitation("name?", Some("user_name")))
                .await
                .is_err()
        );
        let RoundEnd::Invalid(error) = inputs.ended().await else {
            panic!("an invalid answer ends the round");
        };
        assert_eq!(error.code, RpcCode::INVALID_PARAMS);
        assert!(error.message.contains("user_name"), "{}", error.message);

        let undeclared = Inputs::new(BTreeMap::new(), ClientCapabilities::default());
        let refused = undeclared
            .sample(serde_json::from_value(json!({"messages": [], "maxTokens": 5})).unwrap())
            .await
            .expect_err("no sampling capability");
        assert_eq!(refused.code, MISSING_CAPABILITY);
    }
}
