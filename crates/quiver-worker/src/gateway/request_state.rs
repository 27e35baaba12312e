//! The gateway's `requestState` (MCP 2026-07-28 multi-round-trip requests):
//! what a request needs from its earlier rounds, carried by the client and
//! signed by the fleet.
//!
//! A 2026-07-28 request that needs input from the client ends in an
//! `input_required` result; the client retries the same request with the
//! answers (`inputResponses`) and the `requestState` it got. Any worker may
//! serve the retry, so the state holds everything the next round needs —
//! the answers given so far and the approval being waited for — and an
//! HMAC tag under the fleet's key (the same secret as session ids, with a
//! key of its own), so a client can neither forge answers it never gave
//! through the gateway nor carry a state over to another caller, endpoint,
//! request or arguments: the state names a digest of all of these.
//! States expire after [`STATE_LIFETIME`].

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::gateway::session_id::now_ms;

type HmacSha256 = Hmac<Sha256>;

/// How long a state is accepted after it was issued: long enough for a
/// person to answer an elicitation or an approver to approve.
pub const STATE_LIFETIME: Duration = Duration::from_secs(3600);

/// The prefix of the gateway's states (the format's version).
const PREFIX: &str = "qs1";

/// What one request is: a state is valid only for the same again.
#[derive(Debug, Clone, Copy)]
pub struct RequestBinding<'a> {
    /// The caller's principal.
    pub caller: &'a str,
    /// The endpoint (`/mcp/<id>`, `/mcp?server_ids=…`).
    pub endpoint: &'a str,
    /// The JSON-RPC method (`tools/call`, `prompts/get`, `resources/read`).
    pub method: &'a str,
    /// The tool or prompt name, or the resource URI.
    pub target: &'a str,
    /// The request's arguments (`null` when it has none).
    pub arguments: &'a serde_json::Value,
}

impl RequestBinding<'_> {
    fn digest(&self) -> String {
        let mut hasher = Sha256::new();
        let arguments = self.arguments.to_string();
        for part in [
            self.caller,
            self.endpoint,
            self.method,
            self.target,
            &arguments,
        ] {
            // Length-prefixed, so no two splits of the same bytes collide.
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part.as_bytes());
        }
        URL_SAFE_NO_PAD.encode(hasher.finalize())
    }
}

/// What a state carries from one round to the next.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RoundState {
    /// The client's answers the server used so far, by input key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub answers: BTreeMap<String, serde_json::Value>,
    /// The approval the call waits for (§13.7), once requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
    /// Whether that approval was used for this call (a later round runs
    /// the call again with the client's answers, under the same approval).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub approval_used: bool,
    /// Whether the server itself (of 2026-07-28) answered the last round
    /// `input_required`: the client's answers then go to it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub upstream_asked: bool,
    /// That server's own `requestState`, echoed to it unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_state: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct Payload {
    /// [`RequestBinding::digest`].
    bound: String,
    /// Unix milliseconds after which the state is refused.
    expires_ms: u64,
    #[serde(flatten)]
    round: RoundState,
}

/// Why a presented state was refused (each a -32602 to the client).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StateRefused {
    /// Not a state of this fleet's gateway, or altered.
    #[error("requestState is not one this gateway issued, or it was altered")]
    Tampered,
    /// Issued for another caller, endpoint, request or arguments.
    #[error(
        "requestState was issued for another request (caller, endpoint, method, name or arguments differ)"
    )]
    OtherRequest,
    /// Older than [`STATE_LIFETIME`].
    #[error("requestState expired (it is accepted for {} s); send the request again without it", STATE_LIFETIME.as_secs())]
    Expired,
}

/// Signs and opens states with the fleet's key.
#[derive(Clone)]
pub struct RequestStates {
    key: [u8; 32],
}

impl std::fmt::Debug for RequestStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RequestStates(..)")
    }
}

impl RequestStates {
    /// States under a key derived from `secret` (the fleet's session
    /// secret: every worker opens every other's states).
    pub fn new(secret: &[u8]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"quiver mcp request state v1\0");
        hasher.update(secret);
        RequestStates {
            key: hasher.finalize().into(),
        }
    }

    /// States under a random key: only this worker opens them.
    pub fn random() -> Self {
        RequestStates::new(&rand::random::<[u8; 32]>())
    }

    fn tag(&self, body: &str) -> [u8; 32] {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(body.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// The state the client carries to the next round of `binding`.
    pub fn seal(&self, binding: &RequestBinding<'_>, round: RoundState) -> String {
        let expires_ms = now_ms().saturating_add(STATE_LIFETIME.as_millis() as u64);
        self.seal_until(binding, round, expires_ms)
    }

    fn seal_until(
        &self,
        binding: &RequestBinding<'_>,
        round: RoundState,
        expires_ms: u64,
    ) -> String {
        let payload = Payload {
            bound: binding.digest(),
            expires_ms,
            round,
        };
        let json = serde_json::to_vec(&payload).expect("a state serializes");
        let body = format!("{PREFIX}.{}", URL_SAFE_NO_PAD.encode(json));
        let tag = URL_SAFE_NO_PAD.encode(self.tag(&body));
        format!("{body}.{tag}")
    }

    /// What a presented state carries, if this fleet issued it for
    /// `binding` and it has not expired.
    pub fn open(
        &self,
        presented: &str,
        binding: &RequestBinding<'_>,
    ) -> Result<RoundState, StateRefused> {
        let (body, tag) = presented.rsplit_once('.').ok_or(StateRefused::Tampered)?;
        let tag = URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| StateRefused::Tampered)?;
        // Constant time: the comparison must not tell how much of a guess matched.
        if !bool::from(tag.as_slice().ct_eq(&self.tag(body))) {
            return Err(StateRefused::Tampered);
        }
        let encoded = body
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.strip_prefix('.'))
            .ok_or(StateRefused::Tampered)?;
        let payload: Payload = URL_SAFE_NO_PAD
            .decode(encoded)
            .ok()
            .and_then(|json| serde_json::from_slice(&json).ok())
            .ok_or(StateRefused::Tampered)?;
        if payload.bound != binding.digest() {
            return Err(StateRefused::OtherRequest);
        }
        if now_ms() >= payload.expires_ms {
            return Err(StateRefused::Expired);
        }
        Ok(payload.round)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn binding(arguments: &serde_json::Value) -> RequestBinding<'_> {
        RequestBinding {
            caller: "key:a",
            endpoint: "/mcp/docs",
            method: "tools/call",
            target: "search",
            arguments,
        }
    }

    fn round() -> RoundState {
        RoundState {
            answers: BTreeMap::from([("user_name".to_owned(), json!({"action": "accept"}))]),
            approval_id: Some("ap_1".to_owned()),
            approval_used: false,
            upstream_asked: true,
            upstream_state: Some("the server's own".to_owned()),
        }
    }

    #[test]
    fn a_state_opens_for_its_request_on_any_worker_of_the_fleet() {
        let arguments = json!({"q": "x"});
        let state = RequestStates::new(b"fleet").seal(&binding(&arguments), round());
        assert_eq!(
            RequestStates::new(b"fleet").open(&state, &binding(&arguments)),
            Ok(round())
        );
        assert_eq!(
            RequestStates::random().open(&state, &binding(&arguments)),
            Err(StateRefused::Tampered)
        );
    }

    #[test]
    fn a_state_does_not_open_for_another_request_caller_or_arguments() {
        let states = RequestStates::new(b"fleet");
        let arguments = json!({"q": "x"});
        let state = states.seal(&binding(&arguments), round());
        let other_arguments = json!({"q": "y"});
        assert_eq!(
            states.open(&state, &binding(&other_arguments)),
            Err(StateRefused::OtherRequest)
        );
        let other_caller = RequestBinding {
            caller: "key:b",
            ..binding(&arguments)
        };
        assert_eq!(
            states.open(&state, &other_caller),
            Err(StateRefused::OtherRequest)
        );
        let other_tool = RequestBinding {
            target: "delete",
            ..binding(&arguments)
        };
        assert_eq!(
            states.open(&state, &other_tool),
            Err(StateRefused::OtherRequest)
        );
    }

    #[test]
    fn altered_malformed_or_expired_states_are_refused() {
        let states = RequestStates::new(b"fleet");
        let arguments = json!(null);
        let state = states.seal(&binding(&arguments), round());
        let (body, tag) = state.rsplit_once('.').unwrap();
        // The answers swapped for others under the old tag.
        let forged_round = RoundState {
            approval_id: Some("ap_2".to_owned()),
            ..round()
        };
        let forged = states.seal(&binding(&arguments), forged_round);
        let forged_body = forged.rsplit_once('.').unwrap().0;
        for bad in [
            "",
            "qs1",
            "qs1.e30",
            &format!("{forged_body}.{tag}"),
            &format!("{body}x.{tag}"),
            &format!("{body}.{tag}x"),
            &state.replacen("qs1", "qs2", 1),
        ] {
            assert_eq!(
                states.open(bad, &binding(&arguments)),
                Err(StateRefused::Tampered),
                "{bad:?}"
            );
        }
        let expired = states.seal_until(&binding(&arguments), round(), now_ms() - 1);
        assert_eq!(
            states.open(&expired, &binding(&arguments)),
            Err(StateRefused::Expired)
        );
    }
}
