//! The router as hyper calls it on one connection: each request marks the
//! connection busy until its response body is done.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::{Request, Response};
use tower::ServiceExt;

use crate::connections::{Connection, RequestGuard};

/// `router` serving the requests of `connection`.
pub(crate) struct Tracked {
    router: Router,
    connection: Arc<Connection>,
}

impl Tracked {
    pub(crate) fn new(router: Router, connection: Arc<Connection>) -> Self {
        Tracked { router, connection }
    }
}

impl hyper::service::Service<Request<Incoming>> for Tracked {
    type Response = Response<TrackedBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let request_in_flight = self.connection.request_started();
        let router = self.router.clone();
        Box::pin(async move {
            let response = router.oneshot(request).await?;
            Ok(response.map(|body| TrackedBody {
                body,
                _request_in_flight: request_in_flight,
            }))
        })
    }
}

/// A response body that keeps its request counted as in flight until
/// hyper has sent it and dropped it.
pub(crate) struct TrackedBody {
    body: Body,
    _request_in_flight: RequestGuard,
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
