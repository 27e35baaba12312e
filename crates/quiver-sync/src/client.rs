//! The gRPC client of the registry: endpoint, bearer token and the calls
//! the sync makes, with timeouts and conversion to domain types.

use std::future::Future;
use std::time::Duration;

use quiver_model::StoredServer;
use quiver_proto::credentials::Credentials;
use quiver_proto::v1 as pb;
use tonic::transport::Endpoint;

use crate::{SyncError, SyncOptions};

/// Large registries list many records in one message; tonic's 4 MiB
/// default would turn growth into a sync outage.
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

type Client = quiver_proto::credentials::RegistryClient;

/// Builds clients; every client gets its own lazily connected channel.
#[derive(Clone)]
pub(crate) struct Connector {
    endpoint: Endpoint,
    credentials: Credentials,
    request_timeout: Duration,
}

impl Connector {
    pub(crate) fn new(options: &SyncOptions) -> Result<Self, SyncError> {
        let endpoint = Endpoint::from_shared(options.registry_url.clone())
            .map_err(|err| {
                SyncError::InvalidOptions(format!("registry_url {:?}: {err}", options.registry_url))
            })?
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
                    "registry_ca needs an https:// registry_url".to_owned(),
                ));
            }
            (false, None) => endpoint,
        };
        let credentials = Credentials::new(options.token.as_deref(), None).map_err(|_| {
            SyncError::InvalidOptions(
                "token must be printable ascii without line breaks".to_owned(),
            )
        })?;
        Ok(Connector {
            endpoint,
            credentials,
            request_timeout: options.request_timeout,
        })
    }

    /// A client on a fresh channel: after a failure the next attempt must
    /// not inherit a connection in an unknown state.
    pub(crate) fn client(&self) -> RegistryClient {
        let client = self
            .credentials
            .clone()
            .client(self.endpoint.connect_lazy())
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        RegistryClient {
            client,
            timeout: self.request_timeout,
        }
    }
}

/// The registry's records at one revision.
pub(crate) struct Listed {
    pub(crate) revision: u64,
    pub(crate) servers: Vec<StoredServer>,
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

fn convert(server: pb::McpServer) -> Result<StoredServer, SyncError> {
    let server_id = server
        .spec
        .as_ref()
        .map(|spec| spec.server_id.clone())
        .unwrap_or_default();
    StoredServer::try_from(server).map_err(|source| SyncError::Conversion { server_id, source })
}
