//! The gRPC `McpRegistryService` (docs/reference.md §3).
//!
//! Record reads need the worker, viewer, editor or admin token; record
//! writes the editor or admin token; the data plane's other calls (status
//! reports, approvals, OAuth access tokens, gateway sessions) the worker or
//! admin token (docs/reference.md §5). Reads with the worker or admin token
//! are not masked: workers must see the literal values they start servers
//! with; viewer and editor reads are masked like REST reads.

use std::pin::Pin;

use futures::Stream;
use quiver_mcp::credentials::Renewal;
use quiver_model::approval::ApprovalBinding;
use quiver_model::{McpServerSpec, Source};
use quiver_proto::approval::use_outcome_to;
use quiver_proto::v1 as pb;
use quiver_proto::v1::mcp_approval_service_server::McpApprovalService;
use quiver_proto::v1::mcp_o_auth_service_server::McpOAuthService;
use quiver_proto::v1::mcp_registry_service_server::McpRegistryService;
use quiver_store::{DeleteRequest, UpsertOutcome, UpsertRequest};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::approvals::ApprovalRequest;
use crate::auth::{Need, Role};
use crate::encoded::{masked, masked_list, watch_message};
use crate::error::RegistryError;
use crate::feed::WatchEvent;
use crate::oauth::broker::Issued;
use crate::state::RegistryState;
use crate::workers::{ServerHealth, WorkerStatus};

pub use quiver_proto::credentials::ACTOR_METADATA;

/// The tonic service; wraps the shared registry state.
#[derive(Clone)]
pub struct GrpcService {
    state: RegistryState,
}

impl GrpcService {
    /// A service over `state`.
    pub fn new(state: RegistryState) -> Self {
        GrpcService { state }
    }

    pub(crate) fn role<T>(
        &self,
        request: &Request<T>,
        needed: Need,
    ) -> Result<Role, RegistryError> {
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|value| value.to_str().ok());
        let (role, _) = self.state.authenticate_token(header)?;
        role.require(needed)?;
        Ok(role)
    }

    fn actor<T>(request: &Request<T>) -> String {
        crate::state::actor_name(
            request
                .metadata()
                .get(ACTOR_METADATA)
                .and_then(|value| value.to_str().ok()),
            "api",
        )
    }
}

/// Most key uses one status report may carry.
const MAX_KEY_USES: usize = 10_000;

/// The API key uses of a status report, checked.
fn key_uses(
    uses: Vec<pb::ApiKeyUse>,
) -> Result<Vec<(String, chrono::DateTime<chrono::Utc>)>, RegistryError> {
    if uses.len() > MAX_KEY_USES {
        return Err(RegistryError::invalid(
            "key_uses",
            format!("at most {MAX_KEY_USES} per report, got {}", uses.len()),
        ));
    }
    uses.into_iter()
        .enumerate()
        .map(|(at, used)| {
            let when = used
                .last_used_at
                .and_then(|t| chrono::DateTime::from_timestamp(t.seconds, t.nanos.max(0) as u32))
                .ok_or_else(|| {
                    RegistryError::invalid(
                        format!("key_uses[{at}].last_used_at"),
                        "missing or out of range",
                    )
                })?;
            // A worker's clock cannot move a key's use into the future.
            Ok((used.key_id, when.min(chrono::Utc::now())))
        })
        .collect()
}

fn health_state(state: i32) -> &'static str {
    match pb::ServerHealthState::try_from(state) {
        Ok(pb::ServerHealthState::Connected) => "connected",
        Ok(pb::ServerHealthState::Degraded) => "degraded",
        Ok(pb::ServerHealthState::Down) => "down",
        Ok(pb::ServerHealthState::Idle) => "idle",
        _ => "unknown",
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchMcpServersResponse, Status>> + Send>>;

#[tonic::async_trait]
impl McpRegistryService for GrpcService {
    async fn list_mcp_servers(
        &self,
        request: Request<pb::ListMcpServersRequest>,
    ) -> Result<Response<pb::ListMcpServersResponse>, Status> {
        // The registry's listener answers this call with the encoded head
        // before it gets here ([`crate::encoded`]); this path serves other
        // embeddings of the service.
        let role = self.role(&request, Need::Reader)?;
        let head = self.state.feed.head().await?;
        Ok(Response::new(if role.reads_literals_over_grpc() {
            head.list_message()
        } else {
            masked_list(&head)
        }))
    }

    async fn get_mcp_server(
        &self,
        request: Request<pb::GetMcpServerRequest>,
    ) -> Result<Response<pb::GetMcpServerResponse>, Status> {
        let role = self.role(&request, Need::Reader)?;
        let id = &request.get_ref().server_id;
        let server = self
            .state
            .store
            .get(id)
            .await
            .map_err(RegistryError::from)?
            .ok_or_else(|| RegistryError::NotFound(format!("mcp server {id:?} not found")))?;
        let server = if role.reads_literals_over_grpc() {
            server
        } else {
            masked(server)
        };
        Ok(Response::new(pb::GetMcpServerResponse {
            server: Some((&server).into()),
        }))
    }

    type WatchMcpServersStream = WatchStream;

    async fn watch_mcp_servers(
        &self,
        request: Request<pb::WatchMcpServersRequest>,
    ) -> Result<Response<Self::WatchMcpServersStream>, Status> {
        let role = self.role(&request, Need::Reader)?;
        let events = self
            .state
            .feed
            .watch(request.get_ref().since_revision)
            .await?;
        let secrets = role.reads_literals_over_grpc();
        let stream = ReceiverStream::new(events).map(move |event| match event {
            Ok(WatchEvent::Change(change)) => Ok(watch_message(&change, !secrets)),
            Ok(WatchEvent::Heartbeat(revision)) => Ok(pb::WatchMcpServersResponse {
                revision,
                heartbeat: true,
                ..Default::default()
            }),
            Err(err) => Err(Status::from(err)),
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn upsert_mcp_server(
        &self,
        request: Request<pb::UpsertMcpServerRequest>,
    ) -> Result<Response<pb::UpsertMcpServerResponse>, Status> {
        self.role(&request, Need::Editor)?;
        let actor = Self::actor(&request);
        let request = request.into_inner();
        let spec = request
            .server
            .ok_or_else(|| RegistryError::invalid("server", "missing record"))?;
        let spec = McpServerSpec::try_from(spec).map_err(RegistryError::from)?;
        let outcome = self
            .state
            .upsert(UpsertRequest {
                spec,
                expected_revision: request.expected_revision,
                actor,
                source: Source::Api,
            })
            .await?;
        Ok(Response::new(pb::UpsertMcpServerResponse {
            unchanged: matches!(outcome, UpsertOutcome::Unchanged(_)),
            server: Some(outcome.server().into()),
        }))
    }

    async fn apply_mcp_servers(
        &self,
        request: Request<pb::ApplyMcpServersRequest>,
    ) -> Result<Response<pb::ApplyMcpServersResponse>, Status> {
        self.role(&request, Need::Editor)?;
        let actor = Self::actor(&request);
        let mut requests = Vec::new();
        for (index, entry) in request.into_inner().servers.into_iter().enumerate() {
            let spec = entry.server.ok_or_else(|| {
                RegistryError::invalid("server", "missing record").in_record(index)
            })?;
            let spec = McpServerSpec::try_from(spec)
                .map_err(|err| RegistryError::from(err).in_record(index))?;
            requests.push(UpsertRequest {
                spec,
                expected_revision: entry.expected_revision,
                actor: actor.clone(),
                source: Source::Api,
            });
        }
        let outcomes = self.state.apply(requests).await?;
        let (first_revision, last_revision) = crate::state::revision_range(&outcomes);
        Ok(Response::new(pb::ApplyMcpServersResponse {
            results: outcomes
                .iter()
                .map(|outcome| pb::UpsertMcpServerResponse {
                    unchanged: matches!(outcome, UpsertOutcome::Unchanged(_)),
                    server: Some(outcome.server().into()),
                })
                .collect(),
            first_revision,
            last_revision,
        }))
    }

    async fn delete_mcp_server(
        &self,
        request: Request<pb::DeleteMcpServerRequest>,
    ) -> Result<Response<pb::DeleteMcpServerResponse>, Status> {
        self.role(&request, Need::Editor)?;
        let actor = Self::actor(&request);
        let request = request.into_inner();
        let revision = self
            .state
            .delete(DeleteRequest {
                server_id: request.server_id,
                expected_revision: request.expected_revision,
                actor,
                source: Source::Api,
            })
            .await?;
        Ok(Response::new(pb::DeleteMcpServerResponse { revision }))
    }

    async fn get_mcp_server_history(
        &self,
        request: Request<pb::GetMcpServerHistoryRequest>,
    ) -> Result<Response<pb::GetMcpServerHistoryResponse>, Status> {
        let role = self.role(&request, Need::Reader)?;
        let mut entries = self.state.history(&request.get_ref().server_id).await?;
        if !role.reads_literals_over_grpc() {
            for entry in &mut entries {
                entry.spec = entry.spec.take().map(|spec| spec.masked());
            }
        }
        Ok(Response::new(pb::GetMcpServerHistoryResponse {
            entries: entries.iter().map(Into::into).collect(),
        }))
    }

    async fn report_worker_status(
        &self,
        request: Request<pb::ReportWorkerStatusRequest>,
    ) -> Result<Response<pb::ReportWorkerStatusResponse>, Status> {
        self.role(&request, Need::Worker)?;
        let mut report = request.into_inner();
        let uses = key_uses(std::mem::take(&mut report.key_uses))?;
        if !uses.is_empty() {
            self.state
                .store
                .touch_api_keys(&uses)
                .await
                .map_err(RegistryError::from)?;
        }
        // From memory: a report per worker every few seconds costs no read.
        let head_revision = self.state.feed.known_revision();
        self.state.workers.report(
            WorkerStatus {
                worker_id: report.worker_id,
                snapshot_revision: report.snapshot_revision,
                degraded: report.degraded,
                servers: report
                    .servers
                    .into_iter()
                    .map(|s| ServerHealth {
                        state: health_state(s.state),
                        server_id: s.server_id,
                        last_error: s.last_error,
                        reconnect_count: s.reconnect_count,
                        tool_count: s.tool_count,
                        p50_latency_ms: s.p50_latency_ms,
                        session_connections: s.session_connections,
                    })
                    .collect(),
                reported_at: chrono::Utc::now(),
            },
            head_revision,
        )?;
        Ok(Response::new(pb::ReportWorkerStatusResponse {
            head_revision,
        }))
    }
}

/// The tonic `McpApprovalService` (docs/reference.md §13.7): workers (or
/// the admin) request, use and read approvals; the approver token has no
/// gRPC access, and deciding is REST only.
#[derive(Clone)]
pub struct GrpcApprovalService {
    inner: GrpcService,
}

impl GrpcApprovalService {
    /// A service over `state`.
    pub fn new(state: RegistryState) -> Self {
        GrpcApprovalService {
            inner: GrpcService::new(state),
        }
    }

    /// Checks the worker (or admin) credential; returns its role and the
    /// worker's id it names (`x-quiver-actor`, audit only).
    fn credential<T>(&self, request: &Request<T>) -> Result<(Role, String), RegistryError> {
        let role = self.inner.role(request, Need::Worker)?;
        let via = crate::state::actor_name(
            request
                .metadata()
                .get(ACTOR_METADATA)
                .and_then(|value| value.to_str().ok()),
            "",
        );
        Ok((role, via))
    }
}

/// The worker's id: the one in the request, else its `x-quiver-actor`.
fn worker_of(sent: &str, metadata_actor: String) -> String {
    let sent = crate::state::actor_name(Some(sent), "");
    if sent.is_empty() {
        metadata_actor
    } else {
        sent
    }
}

#[tonic::async_trait]
impl McpApprovalService for GrpcApprovalService {
    async fn request_approval(
        &self,
        request: Request<pb::RequestApprovalRequest>,
    ) -> Result<Response<pb::RequestApprovalResponse>, Status> {
        let (role, actor) = self.credential(&request)?;
        let body = request.into_inner();
        let requested_by =
            crate::approvals::caller_principal("requested_by", &body.requested_by, role)?;
        let via = worker_of(&body.worker_id, actor);
        let approval = self
            .inner
            .state
            .request_approval(
                ApprovalRequest {
                    binding: ApprovalBinding {
                        task: body.task,
                        server_id: body.server_id,
                        tool: body.tool,
                        arguments_hash: body.arguments_hash,
                        record_revision: body.record_revision,
                    },
                    arguments_json: body.arguments_json,
                },
                &requested_by,
                &via,
            )
            .await?;
        Ok(Response::new(pb::RequestApprovalResponse {
            approval: Some((&approval).into()),
        }))
    }

    async fn use_approval(
        &self,
        request: Request<pb::UseApprovalRequest>,
    ) -> Result<Response<pb::UseApprovalResponse>, Status> {
        let (role, actor) = self.credential(&request)?;
        let body = request.into_inner();
        let used_by = crate::approvals::caller_principal("used_by", &body.used_by, role)?;
        let via = worker_of(&body.worker_id, actor);
        let call = ApprovalBinding {
            task: body.task,
            server_id: body.server_id,
            tool: body.tool,
            arguments_hash: body.arguments_hash,
            record_revision: body.record_revision,
        };
        let (outcome, approval) = self
            .inner
            .state
            .use_approval(&body.approval_id, &call, &used_by, &via)
            .await?;
        let (outcome, mismatch_field) = use_outcome_to(outcome);
        Ok(Response::new(pb::UseApprovalResponse {
            outcome: outcome.into(),
            mismatch_field,
            approval: approval.as_ref().map(Into::into),
        }))
    }

    async fn get_approval(
        &self,
        request: Request<pb::GetApprovalRequest>,
    ) -> Result<Response<pb::GetApprovalResponse>, Status> {
        self.credential(&request)?;
        let approval = self
            .inner
            .state
            .approval(&request.get_ref().approval_id)
            .await?;
        Ok(Response::new(pb::GetApprovalResponse {
            approval: Some((&approval).into()),
        }))
    }
}

/// The tonic `McpOAuthService` (docs/reference.md §13.6): workers (or the
/// admin) get current access tokens of OAuth connections.
#[derive(Clone)]
pub struct GrpcOAuthService {
    inner: GrpcService,
}

impl GrpcOAuthService {
    /// A service over `state`.
    pub fn new(state: RegistryState) -> Self {
        GrpcOAuthService {
            inner: GrpcService::new(state),
        }
    }
}

fn unix_millis(at: Option<chrono::DateTime<chrono::Utc>>) -> i64 {
    at.map(|at| at.timestamp_millis()).unwrap_or_default()
}

#[tonic::async_trait]
impl McpOAuthService for GrpcOAuthService {
    async fn get_access_token(
        &self,
        request: Request<pb::GetAccessTokenRequest>,
    ) -> Result<Response<pb::GetAccessTokenResponse>, Status> {
        let role = self.inner.role(&request, Need::Worker)?;
        let metadata_actor = crate::state::actor_name(
            request
                .metadata()
                .get(ACTOR_METADATA)
                .and_then(|value| value.to_str().ok()),
            "",
        );
        let body = request.into_inner();
        // Who asks: the credential's role and the worker's id it names.
        let worker = worker_of(&body.worker_id, metadata_actor);
        let actor = if worker.is_empty() {
            role.as_str().to_owned()
        } else {
            format!("{}:{worker}", role.as_str())
        };
        crate::oauth::spec::check_name(&body.auth_ref).map_err(|_| {
            RegistryError::invalid(
                "auth_ref",
                "must name an OAuth connection: letters, digits, '_', '.' or '-'",
            )
        })?;
        let renewal = match (
            body.rejected_token_sha256.as_str(),
            body.insufficient_scope.as_str(),
        ) {
            ("", "") => Renewal::Current,
            (rejected, "") => Renewal::Rejected(rejected),
            ("", scope) => Renewal::StepUp(scope),
            _ => {
                return Err(RegistryError::invalid(
                    "insufficient_scope",
                    "give rejected_token_sha256 or insufficient_scope, not both",
                )
                .into());
            }
        };
        let principal = principal_of(&body.principal)?;
        let issued = self
            .inner
            .state
            .oauth
            .access_token_for(&body.auth_ref, principal, renewal, &actor)
            .await?;
        Ok(Response::new(match issued {
            Issued::Token(token) => pb::GetAccessTokenResponse {
                access_token: token.access_token,
                expires_at_ms: unix_millis(token.expires_at),
                refresh_at_ms: unix_millis(token.refresh_at),
                grant_id: token.grant_id,
                per_user: token.per_user,
                ..Default::default()
            },
            Issued::Consent(link) => pb::GetAccessTokenResponse {
                per_user: true,
                authorization_url: link.url,
                authorization_expires_at_ms: link.expires_at.timestamp_millis(),
                ..Default::default()
            },
            Issued::NoPrincipal => pb::GetAccessTokenResponse {
                per_user: true,
                ..Default::default()
            },
        }))
    }

    async fn list_grants(
        &self,
        request: Request<pb::ListGrantsRequest>,
    ) -> Result<Response<pb::ListGrantsResponse>, Status> {
        self.inner.role(&request, Need::Worker)?;
        let body = request.into_inner();
        let principal = principal_of(&body.principal)?
            .ok_or_else(|| RegistryError::invalid("principal", "is required"))?;
        let grants = self
            .inner
            .state
            .oauth
            .grants(None, Some(principal))
            .await?
            .into_iter()
            .map(|grant| pb::OAuthGrant {
                connection: grant.connection,
                principal: grant.principal,
                status: serde_json::to_value(grant.status)
                    .ok()
                    .and_then(|status| status.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                expires_at_ms: unix_millis(grant.expires_at),
                connected_at_ms: unix_millis(grant.connected_at),
                refresh_count: grant.refresh_count,
                last_error: grant.last_error.unwrap_or_default(),
            })
            .collect();
        Ok(Response::new(pb::ListGrantsResponse { grants }))
    }

    async fn revoke_grant(
        &self,
        request: Request<pb::RevokeGrantRequest>,
    ) -> Result<Response<pb::RevokeGrantResponse>, Status> {
        let role = self.inner.role(&request, Need::Worker)?;
        let body = request.into_inner();
        crate::oauth::spec::check_name(&body.connection)
            .map_err(|_| RegistryError::invalid("connection", "must name an OAuth connection"))?;
        let principal = principal_of(&body.principal)?
            .ok_or_else(|| RegistryError::invalid("principal", "is required"))?;
        self.inner
            .state
            .oauth
            .revoke_grant(
                &body.connection,
                principal,
                &format!("{}:{principal}", role.as_str()),
            )
            .await?;
        Ok(Response::new(pb::RevokeGrantResponse {}))
    }
}

/// Longest principal a request may name.
const MAX_PRINCIPAL_BYTES: usize = 1024;

/// A request's `principal`: `None` when empty; refused naming the field
/// when too long or holding control characters.
fn principal_of(principal: &str) -> Result<Option<&str>, RegistryError> {
    if principal.is_empty() {
        return Ok(None);
    }
    if principal.len() > MAX_PRINCIPAL_BYTES || principal.chars().any(char::is_control) {
        return Err(RegistryError::invalid(
            "principal",
            format!("must be at most {MAX_PRINCIPAL_BYTES} bytes without control characters"),
        ));
    }
    Ok(Some(principal))
}
