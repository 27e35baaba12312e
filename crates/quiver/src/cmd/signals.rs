//! Process signals of the long-running commands: Ctrl-C and SIGTERM stop
//! them, SIGHUP asks the registry for an `mcp.d` rescan.

use tokio_util::sync::CancellationToken;

/// SIGHUP asks for an `mcp.d` rescan, but its default action kills the
/// process, and the rescan task only listens once serving (not at all without
/// an `mcp.d` directory): take the signal over before the slow start-up.
/// Tokio keeps a handler installed for the life of the process.
pub fn take_over_sighup() {
    if let Err(err) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        tracing::warn!(error = %err, "cannot handle SIGHUP");
    }
}

/// Cancels `shutdown` on Ctrl-C or SIGTERM.
pub async fn shutdown_on_signal(shutdown: CancellationToken) {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
    tracing::info!("shutting down");
    shutdown.cancel();
}
