//! The gRPC client of the registry: endpoint, bearer token and the calls
//! the sync makes, with timeouts and conversion to domain types.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use quiver_model::StoredServer;
use quiver_model::access::StoredAccess;
use quiver_proto::credentials::Credentials;
use quiver_proto::v1 as pb;
use tonic::transport::{Channel, Endpoint};

use crate::{SyncError, SyncOptions};

/// Large registries list many records in one message; tonic's 4 MiB
/// default would turn growth into a sync outage.
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

type Client = quiver_proto::credentials::RegistryClient;

/// Builds clients of the replica being followed. Every call of the sync to
/// one replica (list, watch, fetches, status reports, approvals, OAuth,
/// sessions, usage) shares one HTTP/2 connection: a registry holds one
/// connection per worker, not one per kind of call. Its connection cap and
/// descriptors are sized by workers, and a second, mostly idle connection
/// per worker is what the cap sheds first (issue #28: at 10,000 workers the
/// 20,000 connections passed the cap, and closing the oldest idle ones broke
/// other clients' calls).
pub(crate) struct Connector {
    /// One per replica, in the configured order.
    replicas: Vec<Replica>,
    /// Index of the replica being followed.
    current: AtomicUsize,
    credentials: Credentials,
    request_timeout: Duration,
}

struct Replica {
    url: String,
    endpoint: Endpoint,
    /// The sync's connection to this replica, made on first use (a
    /// channel needs the runtime; building a sync does not). It reconnects
    /// by itself, and [`Connector::reconnect`] replaces it.
    channel: Mutex<Option<Channel>>,
}

impl Connector {
    pub(crate) fn new(options: &SyncOptions) -> Result<Self, SyncError> {
        let credentials = Credentials::new(options.token.as_deref(), None).map_err(|_| {
            SyncError::InvalidOptions(
                "token must be printable ascii without line breaks".to_owned(),
            )
        })?;
        let replicas = options
            .registry_urls
            .iter()
            .map(|url| {
                Ok(Replica {
                    url: url.clone(),
                    endpoint: endpoint(url, options)?,
                    channel: Mutex::new(None),
                })
            })
            .collect::<Result<Vec<_>, SyncError>>()?;
        Ok(Connector {
            replicas,
            current: AtomicUsize::new(0),
            credentials,
            request_timeout: options.request_timeout,
        })
    }

    /// The URL of the replica being followed.
    pub(crate) fn current_url(&self) -> &str {
        &self.replica().url
    }

    /// How many replicas there are.
    pub(crate) fn replicas(&self) -> usize {
        self.replicas.len()
    }

    fn replica(&self) -> &Replica {
        &self.replicas[self.current.load(Ordering::Acquire) % self.replicas.len()]
    }

    /// Moves on to the next replica; returns its URL.
    pub(crate) fn fail_over(&self) -> &str {
        let next = (self.current.load(Ordering::Acquire) + 1) % self.replicas.len();
        self.current.store(next, Ordering::Release);
        &self.replicas[next].url
    }

    /// The connection to the replica being followed.
    fn channel(&self) -> Channel {
        let replica = self.replica();
        replica
            .channel
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(|| replica.endpoint.connect_lazy())
            .clone()
    }

    /// Replaces the connection to the replica being followed, after the
    /// follow loop failed on it: the next attempt must not inherit a
    /// connection in an unknown state (half-open, stalled). Calls in flight
    /// finish on the old one.
    pub(crate) fn reconnect(&self) {
        self.replica()
            .channel
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }

    /// A client of the replica being followed.
    pub(crate) fn client(&self) -> RegistryClient {
        let client = self
            .credentials
            .clone()
            .client(self.channel())
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        RegistryClient {
            client,
            timeout: self.request_timeout,
        }
    }

    /// A client of one service of the replica being followed.
    fn client_of<C>(&self, make: impl FnOnce(Credentials, Channel) -> C) -> C {
        make(self.credentials.clone(), self.channel())
    }

    /// The rate-limit and usage client of the replica the sync follows
    /// (its calls bounded by the caller: [`Connector::bounded_by`]).
    pub(crate) fn usage_client(&self) -> quiver_proto::credentials::UsageClient {
        self.client_of(Credentials::usage_client)
    }

    /// Runs one approvals call on the replica the sync follows, within the
    /// request timeout.
    pub(crate) async fn approval_call<T, F, Fut>(
        &self,
        call: &'static str,
        request: F,
    ) -> Result<T, SyncError>
    where
        F: FnOnce(quiver_proto::credentials::ApprovalClient) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let client = self.client_of(Credentials::approval_client);
        self.bounded(call, request(client)).await
    }

    /// Runs one OAuth token call on the replica the sync follows, within
    /// the request timeout.
    pub(crate) async fn oauth_call<T, F, Fut>(
        &self,
        call: &'static str,
        request: F,
    ) -> Result<T, SyncError>
    where
        F: FnOnce(quiver_proto::credentials::OAuthClient) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let client = self.client_of(Credentials::oauth_client);
        // A token request may wait for another replica's refresh and then
        // refresh itself (registry: lease wait plus token request).
        let timeout = self.request_timeout.max(OAUTH_CALL_TIMEOUT);
        self.bounded_by(call, timeout, request(client)).await
    }

    /// Runs one gateway-session revocation call on the replica the sync
    /// follows, within `timeout` (the gateway's own bound: it answers a
    /// client meanwhile).
    pub(crate) async fn session_call<T, F, Fut>(
        &self,
        call: &'static str,
        timeout: Duration,
        request: F,
    ) -> Result<T, SyncError>
    where
        F: FnOnce(quiver_proto::credentials::SessionClient) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let client = self.client_of(Credentials::session_client);
        self.bounded_by(call, timeout, request(client)).await
    }

    async fn bounded<T>(
        &self,
        call: &'static str,
        response: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, SyncError> {
        self.bounded_by(call, self.request_timeout, response).await
    }

    pub(crate) async fn bounded_by<T>(
        &self,
        call: &'static str,
        timeout: Duration,
        response: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, SyncError> {
        match tokio::time::timeout(timeout, response).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(SyncError::rpc(call, &status)),
            Err(_) => Err(SyncError::Timeout {
                call,
                after: timeout,
            }),
        }
    }
}

/// Bound on one OAuth token request (at least; the request timeout when longer).
const OAUTH_CALL_TIMEOUT: Duration = Duration::from_secs(40);

/// The channel settings of one replica.
fn endpoint(url: &str, options: &SyncOptions) -> Result<Endpoint, SyncError> {
    let endpoint = Endpoint::from_shared(url.to_owned())
        .map_err(|err| SyncError::InvalidOptions(format!("registry url {url:?}: {err}")))?
        .connect_timeout(options.connect_timeout)
        .tcp_nodelay(true)
        // A half-open connection otherwise goes unnoticed until the
        // idle timeout; pings find it sooner and also keep NATs open.
        .http2_keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    let https = endpoint.uri().scheme_str() == Some("https");
    let endpoint = match (https, options.registry_ca.as_deref()) {
        (true, ca) => {
            let tls = quiver_proto::tls::client_tls(ca)
                .map_err(|err| SyncError::InvalidOptions(format!("registry_ca: {err}")))?;
            endpoint
                .tls_config(tls)
                .map_err(|err| SyncError::InvalidOptions(format!("registry tls: {err}")))?
        }
        (false, Some(_)) => {
            return Err(SyncError::InvalidOptions(
                "registry_ca needs https:// registry urls".to_owned(),
            ));
        }
        (false, None) => endpoint,
    };
    Ok(endpoint)
}

/// The registry's records at one revision.
pub(crate) struct Listed {
    pub(crate) revision: u64,
    pub(crate) servers: Vec<StoredServer>,
    pub(crate) access: Vec<StoredAccess>,
}

/// The calls the sync makes.
#[derive(Clone)]
pub(crate) struct RegistryClient {
    client: Client,
    timeout: Duration,
}

impl RegistryClient {
    async fn call<T>(
        &self,
        call: &'static str,
        response: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, SyncError> {
        match tokio::time::timeout(self.timeout, response).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(SyncError::rpc(call, &status)),
            Err(_) => Err(SyncError::Timeout {
                call,
                after: self.timeout,
            }),
        }
    }

    pub(crate) async fn list(&self) -> Result<Listed, SyncError> {
        let mut client = self.client.clone();
        let response = self
            .call(
                "list",
                client.list_mcp_servers(pb::ListMcpServersRequest {}),
            )
            .await?;
        Ok(Listed {
            revision: response.revision,
            servers: response
                .servers
                .into_iter()
                .map(convert)
                .collect::<Result<_, _>>()?,
            access: response
                .access
                .into_iter()
                .map(convert_access)
                .collect::<Result<_, _>>()?,
        })
    }

    /// One record; `None` when it no longer exists.
    pub(crate) async fn get(&self, server_id: String) -> Result<Option<StoredServer>, SyncError> {
        let mut client = self.client.clone();
        let request = pb::GetMcpServerRequest {
            server_id: server_id.clone(),
        };
        match self.call("get", client.get_mcp_server(request)).await {
            Ok(response) => match response.server {
                Some(server) => convert(server).map(Some),
                None => Err(SyncError::Conversion {
                    server_id,
                    source: quiver_proto::ConversionError(quiver_model::FieldError::new(
                        "server",
                        "missing record",
                    )),
                }),
            },
            Err(err) if err.code() == Some(tonic::Code::NotFound) => Ok(None),
            Err(err) => Err(err),
        }
    }

    pub(crate) async fn watch(
        &self,
        since_revision: u64,
    ) -> Result<tonic::Streaming<pb::WatchMcpServersResponse>, SyncError> {
        let mut client = self.client.clone();
        self.call(
            "watch",
            client.watch_mcp_servers(pb::WatchMcpServersRequest { since_revision }),
        )
        .await
    }

    pub(crate) async fn report(
        &self,
        request: pb::ReportWorkerStatusRequest,
    ) -> Result<pb::ReportWorkerStatusResponse, SyncError> {
        let mut client = self.client.clone();
        self.call("report", client.report_worker_status(request))
            .await
    }
}

/// An access record of a list or a watch event.
pub(crate) fn convert_access(record: pb::AccessRecord) -> Result<StoredAccess, SyncError> {
    let name = format!("access record {:?}", record.name);
    StoredAccess::try_from(record).map_err(|source| SyncError::Conversion {
        server_id: name,
        source,
    })
}

pub(crate) fn convert(server: pb::McpServer) -> Result<StoredServer, SyncError> {
    let server_id = server
        .spec
        .as_ref()
        .map(|spec| spec.server_id.clone())
        .unwrap_or_default();
    StoredServer::try_from(server).map_err(|source| SyncError::Conversion { server_id, source })
}
