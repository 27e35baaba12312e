//! Requests other than tools forwarded to a server through the pool
//! (prompts, resources, completions), filtered by the record's
//! `allowed_prompts` / `allowed_resources`.

use std::sync::Arc;

use quiver_mcp::relay::CallAttachment;
use quiver_model::StoredServer;
use rmcp::RoleClient;
use rmcp::model::{
    ErrorData, ListPromptsResult, ListResourcesResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ServerResult,
};
use rmcp::service::{Peer, ServiceError};

use crate::gateway::relayed::{forward_error, passed_on, resource_allowed, upstream_params};
use crate::gateway::round::{Carried, Settled, in_round};
use crate::gateway::server::{
    Completed, GATEWAY_CACHE_HINTS, GatewayRequest, GatewayServer, Invocation,
};

/// Pages followed per server when the catalog endpoint lists resources or
/// prompts of several servers (each page is bounded by the pool).
const MAX_CATALOG_PAGES: usize = 20;

impl GatewayServer {
    /// Forwards a request to `server` through the pool (its budgets apply;
    /// a per-session server answers on the session's own connection).
    pub(super) async fn forward<T, F, Fut>(
        &self,
        on: &GatewayRequest,
        server: &Arc<StoredServer>,
        request: F,
    ) -> Result<T, ErrorData>
    where
        T: serde::Serialize,
        F: FnOnce(Peer<RoleClient>) -> Fut,
        Fut: Future<Output = Result<T, ServiceError>>,
    {
        self.forward_attached(on, server, None, request).await
    }

    /// [`forward`](Self::forward), with what the server asks meanwhile
    /// relayed to `attachment`'s client.
    pub(super) async fn forward_attached<T, F, Fut>(
        &self,
        on: &GatewayRequest,
        server: &Arc<StoredServer>,
        attachment: Option<CallAttachment>,
        request: F,
    ) -> Result<T, ErrorData>
    where
        T: serde::Serialize,
        F: FnOnce(Peer<RoleClient>) -> Fut,
        Fut: Future<Output = Result<T, ServiceError>>,
    {
        self.shared
            .runner
            .pool()
            .forward(
                server,
                on.session.as_ref(),
                on.caller.grant_principal().as_deref(),
                attachment,
                request,
            )
            .await
            .map_err(forward_error)
    }

    /// Every page of one server's listing, up to [`MAX_CATALOG_PAGES`]:
    /// `page` fetches one (its items and the next cursor). A page that fails
    /// ends the listing of that server only.
    pub(super) async fn all_pages<T, Fut>(page: impl Fn(Option<String>) -> Fut) -> Vec<T>
    where
        Fut: Future<Output = Result<(Vec<T>, Option<String>), ErrorData>>,
    {
        let mut items = Vec::new();
        let mut cursor = None;
        for _ in 0..MAX_CATALOG_PAGES {
            let Ok((page, next)) = page(cursor.take()).await else {
                break;
            };
            items.extend(page);
            match next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        items
    }

    /// One page of `server`'s prompts the record allows.
    pub(super) async fn prompts_of(
        &self,
        request: &GatewayRequest,
        server: &Arc<StoredServer>,
        cursor: Option<String>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let params = cursor.map(|c| PaginatedRequestParams::default().with_cursor(Some(c)));
        let mut listed = self
            .forward(request, server, |peer| async move {
                peer.list_prompts(params).await
            })
            .await?;
        let filter = Self::content_filter(server)?;
        listed.prompts.retain(|p| filter.allows_prompt(&p.name));
        (listed.ttl_ms, listed.cache_scope) = GATEWAY_CACHE_HINTS;
        Ok(listed.completed())
    }

    /// One page of `server`'s resources the record allows.
    pub(super) async fn resources_of(
        &self,
        request: &GatewayRequest,
        server: &Arc<StoredServer>,
        cursor: Option<String>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let params = cursor.map(|c| PaginatedRequestParams::default().with_cursor(Some(c)));
        let mut listed = self
            .forward(request, server, |peer| async move {
                peer.list_resources(params).await
            })
            .await?;
        let filter = Self::content_filter(server)?;
        listed.resources.retain(|r| filter.allows_resource(&r.uri));
        (listed.ttl_ms, listed.cache_scope) = GATEWAY_CACHE_HINTS;
        Ok(listed.completed())
    }

    /// `resources/read` of one server, in a round without a session.
    pub(super) async fn read_from(
        &self,
        invocation: &Invocation<'_>,
        request: &GatewayRequest,
        server: &Arc<StoredServer>,
        mut params: ReadResourceRequestParams,
    ) -> Result<ReadResourceResponse, ErrorData> {
        resource_allowed(&Self::content_filter(server)?, &params.uri)?;
        let carried = Carried {
            responses: params.input_responses.take(),
            state: params.request_state.take(),
        };
        let key = self.round_key(
            request,
            "resources/read",
            &params.uri,
            serde_json::Value::Null,
        );
        let round = self.round(invocation, key, carried)?;
        (params.input_responses, params.request_state) = upstream_params(round.as_ref());
        let attachment = self.attachment(invocation, round.as_ref()).map(|(_, a)| a);
        let read = self.forward_attached(request, server, attachment, |peer| async move {
            peer.read_resource_once(params)
                .await
                .map(ServerResult::from)
        });
        let mut read = match in_round(round.as_ref(), std::pin::pin!(read)).await? {
            Settled::Done(ServerResult::ReadResourceResult(read)) => read,
            Settled::Done(other) => {
                return Ok(ReadResourceResponse::InputRequired(passed_on(
                    round.as_ref(),
                    other,
                )?));
            }
            Settled::InputRequired(asked) => return Ok(ReadResourceResponse::InputRequired(asked)),
        };
        (read.ttl_ms, read.cache_scope) = GATEWAY_CACHE_HINTS;
        Ok(read.completed().into())
    }
}
