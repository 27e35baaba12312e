//! The gRPC calls every worker makes, answered with bytes encoded once and
//! shared, instead of tonic encoding a copy per call (issue #28).
//!
//! `ListMcpServers` sends the head's encoding, made once per revision
//! ([`crate::head::HeadView::grpc_list`]); `WatchMcpServers` sends each
//! change's frame, made once per change and flavour
//! ([`crate::feed::FeedChange::encoded`]) however many streams carry it, so
//! a change costs the registry one encoding plus a byte copy per watcher,
//! and an open stream holds no encode buffer of its own. Both routes are
//! merged in front of the tonic services, with the same credential check,
//! messages and errors as [`crate::grpc::GrpcService`], which still serves
//! other embeddings of the service.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use bytes::{BufMut, BytesMut};
use http_body::Frame;
use quiver_model::StoredServer;
use quiver_proto::v1 as pb;
use tokio::sync::mpsc;
use tonic::Status;

use crate::auth::{Need, Role};
use crate::error::RegistryError;
use crate::feed::{FeedChange, WatchEvent};
use crate::head::HeadView;
use crate::state::RegistryState;

/// The path of `ListMcpServers`.
pub const LIST_PATH: &str = "/quiver.registry.v1.McpRegistryService/ListMcpServers";
/// The path of `WatchMcpServers`.
pub const WATCH_PATH: &str = "/quiver.registry.v1.McpRegistryService/WatchMcpServers";

/// Length of a gRPC message prefix: the compression flag, then the length.
const PREFIX: usize = 5;

/// The routes of the pre-encoded calls, to merge in front of the tonic
/// services.
pub fn routes(state: RegistryState) -> axum::Router {
    let list = state.clone();
    axum::Router::new()
        .route(
            LIST_PATH,
            axum::routing::post(move |headers: HeaderMap, _request: Bytes| {
                let state = list.clone();
                async move { encoded_list(&state, &headers).await }
            }),
        )
        .route(
            WATCH_PATH,
            axum::routing::post(move |headers: HeaderMap, request: Bytes| {
                let state = state.clone();
                async move { encoded_watch(&state, &headers, &request).await }
            }),
        )
}

/// The caller's role, which must be allowed to read records.
fn reader(state: &RegistryState, headers: &HeaderMap) -> Result<Role, RegistryError> {
    let header = headers
        .get("authorization")
        .and_then(|value| value.to_str().ok());
    let (role, _) = state.authenticate_token(header)?;
    role.require(Need::Reader)?;
    Ok(role)
}

/// A record with literal env/header values masked (reads of roles that do
/// not see secrets, [`Role::reads_literals_over_grpc`]).
pub(crate) fn masked(server: StoredServer) -> StoredServer {
    StoredServer {
        spec: server.spec.masked(),
        ..server
    }
}

/// The head's list message with every record masked.
pub(crate) fn masked_list(head: &HeadView) -> pb::ListMcpServersResponse {
    pb::ListMcpServersResponse {
        revision: head.revision,
        servers: head
            .servers
            .values()
            .map(|server| (&masked(server.as_ref().clone())).into())
            .collect(),
        // Who may call is for the worker and admin credentials only.
        access: Vec::new(),
    }
}

/// The watch event of a change: carrying its records, or masked (an access
/// change then shows only that the revision moved).
pub(crate) fn watch_message(change: &FeedChange, masked_view: bool) -> pb::WatchMcpServersResponse {
    if !masked_view {
        return change.message();
    }
    if change.change.access.is_some() {
        return pb::WatchMcpServersResponse {
            revision: change.change.revision,
            ..Default::default()
        };
    }
    let mut message = pb::WatchMcpServersResponse::from(&change.change);
    if let Some(server) = &change.server {
        message
            .servers
            .push((&masked(server.as_ref().clone())).into());
    }
    message
}

/// `message` as one gRPC message frame: not compressed, its length (big
/// endian), the message.
fn frame(message: &impl prost::Message) -> Bytes {
    let length = message.encoded_len();
    let mut buf = BytesMut::with_capacity(PREFIX + length);
    buf.put_u8(0);
    buf.put_u32(u32::try_from(length).unwrap_or(u32::MAX));
    // The buffer was sized for the message: encoding cannot run out of room.
    let _ = message.encode(&mut buf);
    buf.freeze()
}

fn grpc_response(
    body: impl http_body::Body<Data = Bytes, Error = Infallible> + Send + 'static,
) -> Response {
    let mut response = Response::new(axum::body::Body::new(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    response
}

async fn encoded_list(state: &RegistryState, headers: &HeaderMap) -> Response {
    let head =
        async { Ok::<_, RegistryError>((reader(state, headers)?, state.feed.head().await?)) };
    let (role, head) = match head.await {
        Ok(found) => found,
        Err(err) => return Status::from(err).into_http(),
    };
    let message = if role.reads_literals_over_grpc() {
        head.grpc_list()
    } else {
        Bytes::from(prost::Message::encode_to_vec(&masked_list(&head)))
    };
    let length = u32::try_from(message.len()).unwrap_or(u32::MAX);
    let mut prefix = Vec::with_capacity(PREFIX);
    prefix.push(0);
    prefix.extend_from_slice(&length.to_be_bytes());
    grpc_response(OneMessage {
        chunks: vec![message, Bytes::from(prefix)],
        trailers: true,
    })
}

/// A gRPC response body of one encoded message and an OK status.
struct OneMessage {
    /// Popped from the back: the prefix first.
    chunks: Vec<Bytes>,
    trailers: bool,
}

impl http_body::Body for OneMessage {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(chunk) = this.chunks.pop() {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if std::mem::take(&mut this.trailers) {
            return Poll::Ready(Some(Ok(Frame::trailers(trailers(&Status::ok(""))))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty() && !self.trailers
    }
}

/// The trailers that end a response with `status`.
fn trailers(status: &Status) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    // A status tonic made is valid header text; there is nothing to refuse.
    let _ = status.add_header(&mut trailers);
    trailers
}

/// The request message of a unary-request call, as tonic decodes it.
fn request<M: prost::Message + Default>(body: &[u8]) -> Result<M, Status> {
    let Some((prefix, message)) = body.split_first_chunk::<PREFIX>() else {
        return Err(Status::internal("Missing request message."));
    };
    if prefix[0] != 0 {
        return Err(Status::unimplemented(
            "compressed requests are not supported",
        ));
    }
    let length = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]);
    if usize::try_from(length).ok() != Some(message.len()) {
        return Err(Status::internal("request message length mismatch"));
    }
    M::decode(message)
        .map_err(|err| Status::internal(format!("failed to decode Protobuf message: {err}")))
}

async fn encoded_watch(state: &RegistryState, headers: &HeaderMap, body: &[u8]) -> Response {
    let opened = async {
        let role = reader(state, headers)?;
        let request: pb::WatchMcpServersRequest = request(body)?;
        let events = state.feed.watch(request.since_revision).await?;
        Ok::<_, Status>((role, events))
    };
    match opened.await {
        Ok((role, events)) => grpc_response(WatchBody {
            events,
            masked: !role.reads_literals_over_grpc(),
            ended: false,
        }),
        Err(status) => status.into_http(),
    }
}

/// A `WatchMcpServers` response: each event's shared frame, then the status
/// the stream ended with. Dropped when the client goes away, which closes
/// `events` and so ends the feed's watcher.
struct WatchBody {
    events: mpsc::Receiver<Result<WatchEvent, RegistryError>>,
    masked: bool,
    ended: bool,
}

impl http_body::Body for WatchBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let status = match ready!(this.events.poll_recv(cx)) {
            Some(Ok(WatchEvent::Change(change))) => {
                let masked_view = this.masked;
                let frame = change.encoded(masked_view, |change| {
                    frame(&watch_message(change, masked_view))
                });
                return Poll::Ready(Some(Ok(Frame::data(frame))));
            }
            Some(Ok(WatchEvent::Heartbeat(revision))) => {
                let heartbeat = pb::WatchMcpServersResponse {
                    revision,
                    heartbeat: true,
                    ..Default::default()
                };
                return Poll::Ready(Some(Ok(Frame::data(frame(&heartbeat)))));
            }
            Some(Err(err)) => Status::from(err),
            None => Status::ok(""),
        };
        this.ended = true;
        Poll::Ready(Some(Ok(Frame::trailers(trailers(&status)))))
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::sync::Arc;

    use quiver_model::{Change, ChangeKind, McpServerSpec, Source, StdioConfig, Transport};

    use super::*;

    fn change() -> FeedChange {
        let mut spec = McpServerSpec::new("a", Transport::Stdio);
        spec.stdio = Some(StdioConfig {
            command: "npx".into(),
            env: [("API_KEY".to_owned(), "sk-secret".to_owned())].into(),
            ..Default::default()
        });
        let at = chrono::DateTime::from_timestamp_millis(1_700_000_000_000).unwrap_or_default();
        let server = StoredServer {
            spec,
            revision: 7,
            created_at: at,
            updated_at: at,
            updated_by: "ann".into(),
            source: Source::Api,
        };
        let change = Change {
            revision: 7,
            server_id: "a".into(),
            kind: ChangeKind::Upsert,
            at,
            actor: "ann".into(),
            access: None,
        };
        FeedChange::new(change, Some(Arc::new(server)), None)
    }

    /// The message of a frame, checking its prefix as a gRPC client does.
    fn decoded(frame: &Bytes) -> pb::WatchMcpServersResponse {
        assert_eq!(frame[0], 0, "not compressed");
        let length = u32::from_be_bytes([frame[1], frame[2], frame[3], frame[4]]);
        assert_eq!(length as usize, frame.len() - PREFIX);
        prost::Message::decode(&frame[PREFIX..]).unwrap()
    }

    #[test]
    fn each_flavour_of_a_change_is_encoded_once_for_every_stream() {
        let change = change();
        let encodings = Cell::new(0);
        let send = |masked_view: bool| {
            change.encoded(masked_view, |change| {
                encodings.set(encodings.get() + 1);
                frame(&watch_message(change, masked_view))
            })
        };
        let literal = send(false);
        for _ in 0..3 {
            assert_eq!(send(false).as_ptr(), literal.as_ptr(), "shared bytes");
        }
        let masked_frame = send(true);
        assert_eq!(send(true).as_ptr(), masked_frame.as_ptr());
        assert_eq!(encodings.get(), 2, "one encoding per flavour");

        assert_eq!(decoded(&literal), change.message());
        let masked_message = decoded(&masked_frame);
        assert_eq!(masked_message, watch_message(&change, true));
        assert!(!format!("{masked_message:?}").contains("sk-secret"));
        assert!(format!("{:?}", decoded(&literal)).contains("sk-secret"));
    }

    #[test]
    fn a_request_is_read_as_tonic_reads_it() {
        let request = pb::WatchMcpServersRequest { since_revision: 42 };
        let framed = frame(&request);
        let read: pb::WatchMcpServersRequest = super::request(&framed).unwrap();
        assert_eq!(read, request);
        assert_eq!(
            super::request::<pb::WatchMcpServersRequest>(&[])
                .unwrap_err()
                .code(),
            tonic::Code::Internal
        );
        let mut compressed = framed.to_vec();
        compressed[0] = 1;
        assert_eq!(
            super::request::<pb::WatchMcpServersRequest>(&compressed)
                .unwrap_err()
                .code(),
            tonic::Code::Unimplemented
        );
    }
}
