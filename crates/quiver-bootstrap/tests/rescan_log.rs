//! What a periodic `mcp.d` rescan logs: `quiver dev` rescans every few
//! seconds, so a rescan that changes nothing must stay below INFO.

use std::sync::{Arc, Mutex};

use quiver_bootstrap::reconcile;
use quiver_model::Strictness;
use quiver_store::SqlStore;

/// Log lines written while the guard of [`capture_info`] is alive.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn take(&self) -> String {
        let mut bytes = self.0.lock().unwrap();
        String::from_utf8(std::mem::take(&mut *bytes)).unwrap()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures this thread's events at INFO and above (the binary's default
/// level for Quiver's crates).
fn capture_info() -> (Captured, tracing::subscriber::DefaultGuard) {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (captured, tracing::subscriber::set_default(subscriber))
}

#[tokio::test(flavor = "current_thread")]
async fn only_a_rescan_that_changes_something_logs_at_info() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("echo.toml"),
        "server_id = \"echo\"\ntransport = \"stdio\"\nallowed_tools = [\"*\"]\n\n[stdio]\ncommand = \"echo\"\n",
    )
    .unwrap();
    let store = SqlStore::open_sqlite("sqlite::memory:").await.unwrap();
    let (captured, _guard) = capture_info();

    reconcile(&store, dir.path(), Strictness::Lenient, "bootstrap")
        .await
        .unwrap();
    let first = captured.take();
    assert!(first.contains("mcp.d reconciled"), "{first}");
    assert!(first.contains("1 created"), "{first}");

    for _ in 0..3 {
        reconcile(&store, dir.path(), Strictness::Lenient, "bootstrap")
            .await
            .unwrap();
    }
    let unchanged = captured.take();
    assert_eq!(unchanged, "", "unchanged rescans logged at INFO");

    std::fs::remove_file(dir.path().join("echo.toml")).unwrap();
    reconcile(&store, dir.path(), Strictness::Lenient, "bootstrap")
        .await
        .unwrap();
    let deleted = captured.take();
    assert!(deleted.contains("1 deleted"), "{deleted}");
}
