//! How a connection opens, in the protocol era its record asks for
//! (`protocol`, docs/reference.md §7 R-MCP-8): MCP 2026-07-28 asks
//! `server/discover` and then carries the protocol version, client info and
//! capabilities in every request's `_meta` (rmcp does that once discovery
//! chose the version); 2025-11-25 and the revisions before it open with the
//! `initialize` handshake. `auto` opens with the handshake, which keeps a
//! session (what the worker relays between a server and its callers needs
//! one), and a server that refuses it — one of 2026-07-28 alone — is
//! connected anew with discovery ([`Handshake::without_session`]).
//!
//! When the record insists on 2026-07-28, two kinds of old servers would
//! make rmcp's discovery wait or fail obscurely; the [`EraProbe`] transport
//! adapter makes both fail at once, naming the protocol:
//!
//! - **Servers that ignore methods they do not know** (hand-written stdio
//!   servers answer `initialize`, `tools/*` and `ping` and drop the rest)
//!   would cost rmcp's 10 s. On stdio the probe sends a `ping` right after
//!   `server/discover` (after it, because a 2026-07-28 server may settle its
//!   era on the first message it reads). A server that answers the `ping`
//!   is reading the connection; if it has not answered `server/discover`
//!   [`DISCOVER_GRACE`] later, it never will, and the probe answers the
//!   discovery for it with an error. A server still starting up answers
//!   neither and keeps the full wait. Over HTTP every request gets an HTTP
//!   answer, so no probe is sent there.
//! - **Servers of an SDK that knows 2026-07-28 but offers only older
//!   revisions** answer `server/discover` with "unsupported protocol
//!   version" and the list they support; the probe rewrites such an answer,
//!   when it offers none of the versions asked for, into a plain error
//!   naming what the server offers.
//!
//! The late answers the probe stands in for (its own `ping`'s, a
//! `server/discover` answered after it gave up) are dropped, so rmcp never
//! sees an answer to a request it did not send. The legacy HTTP+SSE
//! transport is older than 2026-07-28 (which has no such transport): it
//! always opens with `initialize`, and `protocol = "2026-07-28"` is refused
//! for it by the record's validation.

use std::time::Duration;

use quiver_model::{Protocol, Transport as TransportKind};
use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, ErrorCode, ErrorData, NumberOrString, PingRequest,
    ProtocolVersion, RequestId, ServerJsonRpcMessage, ServerResult,
};
use rmcp::service::{ClientInitializeError, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::{ClientLifecycleMode, RoleClient};
use tokio::time::Instant;

use crate::error::McpError;

/// How long a stdio server that answered the probe's `ping` gets to answer
/// `server/discover` before it is taken for one that ignores it. Servers
/// answer both from the same loop, and discovery is a table lookup: a
/// server that is up answers it within milliseconds.
pub const DISCOVER_GRACE: Duration = Duration::from_secs(1);

/// Id of the probe's `ping`; rmcp numbers its own requests, so a string
/// cannot collide with them.
const PING_ID: &str = "quiver-era-probe";

/// The versions `auto` and `"2026-07-28"` ask `server/discover` for.
fn preferred_versions() -> Vec<ProtocolVersion> {
    vec![ProtocolVersion::V_2026_07_28]
}

/// The opening of one connection: the record's `protocol` over its transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handshake {
    protocol: Protocol,
    transport: TransportKind,
    /// Discovery first, `initialize` when the server turns out old: what a
    /// one-off client (`quiver mcp probe`) does, which relays nothing.
    discovery_first: bool,
}

impl Handshake {
    /// The opening `protocol` asks for over `transport`.
    pub fn new(protocol: Protocol, transport: TransportKind) -> Self {
        Handshake {
            protocol,
            transport,
            discovery_first: false,
        }
    }

    /// The newest revision the server offers: `server/discover`, falling
    /// back to `initialize` on the same connection (the [`EraProbe`] makes
    /// old servers fall back at once).
    pub const fn newest(transport: TransportKind) -> Self {
        Handshake {
            protocol: Protocol::Auto,
            transport,
            discovery_first: true,
        }
    }

    /// rmcp's lifecycle for it: `auto` opens with the `initialize`
    /// handshake first (see [`Handshake::without_session`]).
    pub fn mode(&self) -> ClientLifecycleMode {
        if self.discovery_first {
            return ClientLifecycleMode::Auto {
                preferred_versions: preferred_versions(),
                legacy_version: Some(ProtocolVersion::LATEST_WITH_INITIALIZE),
            };
        }
        match self.protocol {
            Protocol::V2025_11_25 | Protocol::Auto => ClientLifecycleMode::Initialize,
            Protocol::V2026_07_28 => ClientLifecycleMode::Discover {
                preferred_versions: preferred_versions(),
            },
        }
    }

    /// The opening to try when `auto`'s handshake was refused: the server
    /// may speak 2026-07-28 alone (`server/discover`, no session). `None`
    /// for the other settings and for legacy HTTP+SSE, which has no
    /// 2026-07-28.
    pub fn without_session(&self) -> Option<Handshake> {
        (self.protocol == Protocol::Auto
            && !self.discovery_first
            && self.transport != TransportKind::HttpSseLegacy)
            .then_some(Handshake {
                protocol: Protocol::V2026_07_28,
                transport: self.transport,
                discovery_first: false,
            })
    }

    /// Whether `err` is the server refusing the handshake (an answer, not
    /// a broken connection).
    pub fn refused(err: &ClientInitializeError) -> bool {
        matches!(
            err,
            ClientInitializeError::JsonRpcError(_)
                | ClientInitializeError::NoCompatibleProtocolVersion { .. }
                | ClientInitializeError::ExpectedInitResult(_)
        )
    }

    /// `transport` with the [`EraProbe`] this opening needs.
    pub fn probe<T>(&self, transport: T) -> EraProbe<T> {
        EraProbe {
            inner: transport,
            preferred: preferred_versions(),
            ping_after_discover: self.transport == TransportKind::Stdio,
            discover: None,
            ping: PingState::Unsent,
            dropped_discover: None,
        }
    }

    /// The record's `protocol`, for messages.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// Why the opening failed, naming the protocol when the server does not
    /// speak the one the record insists on.
    pub fn failed(&self, err: ClientInitializeError) -> McpError {
        if self.protocol == Protocol::V2026_07_28 && Self::refused(&err) {
            return McpError::Unavailable(format!(
                "initialize failed: the server does not speak MCP 2026-07-28, which the record asks for (protocol = \"2026-07-28\"; \"auto\" falls back to the initialize handshake): {err}"
            ));
        }
        McpError::Unavailable(format!("initialize failed: {err}"))
    }
}

/// Where the probe's `ping` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PingState {
    /// Not sent (not yet, or not on this transport).
    Unsent,
    /// To be sent before the next message is read.
    Due,
    /// Sent, not answered.
    Sent,
    /// Answered while `server/discover` was not: the discovery is given up
    /// at this instant.
    Answered { give_up_at: Instant },
    /// Answered after `server/discover` was (or given up): nothing to wait for.
    Done,
}

/// A transport that watches the opening of its connection (see the module
/// documentation); afterwards it passes every message through, dropping
/// only the late answers to requests rmcp did not send or gave up.
pub struct EraProbe<T> {
    inner: T,
    preferred: Vec<ProtocolVersion>,
    ping_after_discover: bool,
    /// The `server/discover` awaiting its answer.
    discover: Option<RequestId>,
    ping: PingState,
    /// A `server/discover` answered by the probe: its real answer is dropped.
    dropped_discover: Option<RequestId>,
}

/// Whether `answered` is the id of a response to `sent` (a server may echo
/// a numeric id as a string).
fn same_id(sent: &RequestId, answered: &RequestId) -> bool {
    match (sent, answered) {
        (NumberOrString::Number(sent), NumberOrString::String(text)) => {
            text.parse::<i64>().is_ok_and(|number| number == *sent)
        }
        _ => sent == answered,
    }
}

impl<T> EraProbe<T> {
    /// Notes what the client sends: a `server/discover` to watch, or an
    /// `initialize` that gives up one still unanswered (rmcp falls back
    /// after 10 s of silence; a late answer must not meet the handshake).
    fn sent(&mut self, message: &TxJsonRpcMessage<RoleClient>) {
        let ClientJsonRpcMessage::Request(request) = message else {
            return;
        };
        match request.request {
            ClientRequest::DiscoverRequest(_) => {}
            ClientRequest::InitializeRequest(_) => {
                if let Some(unanswered) = self.discover.take() {
                    self.dropped_discover = Some(unanswered);
                }
                return;
            }
            _ => return,
        }
        self.discover = Some(request.id.clone());
        if self.ping_after_discover && self.ping == PingState::Unsent {
            self.ping = PingState::Due;
        }
    }

    /// What the client is given of what the server sent (`None`: dropped).
    fn received(
        &mut self,
        message: RxJsonRpcMessage<RoleClient>,
    ) -> Option<RxJsonRpcMessage<RoleClient>> {
        let (id, error) = match &message {
            ServerJsonRpcMessage::Response(response) => (Some(&response.id), None),
            ServerJsonRpcMessage::Error(error) => (error.id.as_ref(), Some(&error.error)),
            _ => return Some(message),
        };
        let id = id?.clone();
        let is = |sent: &Option<RequestId>| sent.as_ref().is_some_and(|sent| same_id(sent, &id));
        if same_id(&RequestId::String(PING_ID.into()), &id) {
            // Only a server that answers ping and not discovery is waited
            // for; an error (a 2026-07-28 server has no ping) tells nothing.
            self.ping = if error.is_none() && self.discover.is_some() {
                PingState::Answered {
                    give_up_at: Instant::now() + DISCOVER_GRACE,
                }
            } else {
                PingState::Done
            };
            return None;
        }
        if is(&self.dropped_discover) {
            self.dropped_discover = None;
            return None;
        }
        if !is(&self.discover) {
            return Some(message);
        }
        self.discover = None;
        if matches!(self.ping, PingState::Answered { .. }) {
            self.ping = PingState::Done;
        }
        // A server that answers methods it does not know with an empty
        // result (some old test servers do) did not discover anything.
        if let ServerJsonRpcMessage::Response(response) = &message
            && !matches!(response.result, ServerResult::DiscoverResult(_))
        {
            return Some(old_era_answer(
                id,
                "server/discover: the server answered with another result".to_owned(),
            ));
        }
        match error.and_then(|error| self.offers_only_older(error)) {
            Some(offered) => Some(old_era_answer(
                id,
                format!("server/discover: the server offers only {offered}"),
            )),
            None => Some(message),
        }
    }

    /// What an "unsupported protocol version" answer offers, when it is none
    /// of the versions asked for.
    fn offers_only_older(&self, error: &ErrorData) -> Option<String> {
        if error.code != ErrorCode::UNSUPPORTED_PROTOCOL_VERSION {
            return None;
        }
        let supported: Vec<ProtocolVersion> = error
            .data
            .as_ref()
            .and_then(|data| data.get("supported"))
            .and_then(|supported| serde_json::from_value(supported.clone()).ok())?;
        if supported
            .iter()
            .any(|version| self.preferred.contains(version))
        {
            return None;
        }
        let names: Vec<&str> = supported.iter().map(ProtocolVersion::as_str).collect();
        Some(if names.is_empty() {
            "no protocol version".to_owned()
        } else {
            names.join(", ")
        })
    }

    /// When the discovery is given up, if the server answered the `ping`
    /// and not it.
    fn give_up_at(&self) -> Option<Instant> {
        match (self.ping, &self.discover) {
            (PingState::Answered { give_up_at }, Some(_)) => Some(give_up_at),
            _ => None,
        }
    }

    /// The probe's answer to a `server/discover` the server ignores.
    fn give_up(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        let id = self.discover.take()?;
        self.ping = PingState::Done;
        self.dropped_discover = Some(id.clone());
        Some(old_era_answer(
            id,
            format!(
                "server/discover: unanswered {} ms after the server answered ping (it ignores methods it does not know)",
                DISCOVER_GRACE.as_millis()
            ),
        ))
    }
}

/// An error answer to `server/discover` that rmcp takes for an old server.
fn old_era_answer(id: RequestId, message: String) -> RxJsonRpcMessage<RoleClient> {
    ServerJsonRpcMessage::error(
        ErrorData::new(ErrorCode::METHOD_NOT_FOUND, message, None),
        Some(id),
    )
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for EraProbe<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.sent(&item);
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        // The discovery was sent (rmcp reads only after it has been written):
        // the ping follows it.
        if self.ping == PingState::Due {
            self.ping = PingState::Sent;
            let ping = ClientJsonRpcMessage::request(
                ClientRequest::PingRequest(PingRequest::default()),
                RequestId::String(PING_ID.into()),
            );
            if self.inner.send(ping).await.is_err() {
                // The transport is broken: the discovery's answer tells.
                self.ping = PingState::Done;
            }
        }
        loop {
            let message = match self.give_up_at() {
                Some(at) => tokio::select! {
                    message = self.inner.receive() => message,
                    () = tokio::time::sleep_until(at) => return self.give_up(),
                },
                None => self.inner.receive().await,
            };
            if let Some(message) = self.received(message?) {
                return Some(message);
            }
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_opens_a_session_first_and_discovery_only_when_refused() {
        let handshake = |protocol, transport| Handshake::new(protocol, transport);
        for transport in [
            TransportKind::Stdio,
            TransportKind::StreamableHttp,
            TransportKind::HttpSseLegacy,
        ] {
            assert_eq!(
                handshake(Protocol::Auto, transport).mode(),
                ClientLifecycleMode::Initialize
            );
            assert_eq!(
                handshake(Protocol::V2025_11_25, transport).mode(),
                ClientLifecycleMode::Initialize
            );
            assert_eq!(
                handshake(Protocol::V2025_11_25, transport).without_session(),
                None
            );
            assert_eq!(
                handshake(Protocol::V2026_07_28, transport).without_session(),
                None
            );
        }
        assert!(matches!(
            handshake(Protocol::V2026_07_28, TransportKind::StreamableHttp).mode(),
            ClientLifecycleMode::Discover { .. }
        ));
        // Refused, `auto` tries 2026-07-28, except where it does not exist.
        assert_eq!(
            handshake(Protocol::Auto, TransportKind::Stdio).without_session(),
            Some(handshake(Protocol::V2026_07_28, TransportKind::Stdio))
        );
        assert_eq!(
            handshake(Protocol::Auto, TransportKind::HttpSseLegacy).without_session(),
            None
        );
    }

    #[test]
    fn numeric_ids_match_their_string_echo() {
        assert!(same_id(
            &RequestId::Number(3),
            &RequestId::String("3".into())
        ));
        assert!(!same_id(
            &RequestId::Number(3),
            &RequestId::String("4".into())
        ));
        assert!(same_id(&RequestId::Number(3), &RequestId::Number(3)));
    }
}
