//! How a failing step of a flow is reported (naming the step) and bounded
//! in time.

use std::time::Duration;

use quiver_store::StoreError;
use rmcp::transport::auth::AuthError;

use crate::error::RegistryError;

/// Bound on each network step of a flow (discovery, registration, token
/// request).
pub const STEP_TIMEOUT: Duration = Duration::from_secs(20);

pub(super) fn step(step: &str, message: impl std::fmt::Display) -> RegistryError {
    RegistryError::McpUnavailable {
        message: format!("oauth {step}: {message}"),
        stderr_tail: Vec::new(),
    }
}

pub(super) fn store_error(err: StoreError) -> RegistryError {
    RegistryError::from(err)
}

pub(super) async fn bounded<T>(
    name: &str,
    future: impl Future<Output = Result<T, AuthError>>,
) -> Result<T, RegistryError> {
    tokio::time::timeout(STEP_TIMEOUT, future)
        .await
        .map_err(|_| {
            step(
                name,
                format!("no answer within {} s", STEP_TIMEOUT.as_secs()),
            )
        })?
        .map_err(|err| step(name, err))
}
