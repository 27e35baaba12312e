//! The two backends every store test runs on: SQLite (a file in a temporary
//! directory) and PostgreSQL (a fresh database on this machine's server),
//! and `suite!`, which runs each listed test on each listed backend.

use std::sync::Arc;

use quiver_store::SqlStore;
use quiver_testkit::postgres::TestDatabase;

/// A store on a new SQLite file, and what keeps the file alive.
pub async fn sqlite() -> (Arc<SqlStore>, Box<dyn std::any::Any + Send>) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("registry.db").display());
    (
        Arc::new(SqlStore::open_sqlite(&url).await.unwrap()),
        Box::new(dir),
    )
}

/// A store on a new PostgreSQL database, and what drops it afterwards.
pub async fn postgres() -> (Arc<SqlStore>, Box<dyn std::any::Any + Send>) {
    let db = TestDatabase::create().await;
    let store = Arc::new(SqlStore::open_postgres(db.url()).await.unwrap());
    (store, Box::new(db))
}

/// `suite!(sqlite, postgres; [test_a, test_b])`: a `#[tokio::test]` per
/// backend and test, each on a store of its own.
#[macro_export]
macro_rules! suite {
    ($($backend:ident),*; $tests:tt) => {
        $($crate::suite!(@backend $backend $tests);)*
    };
    (@backend $backend:ident [$($test:ident),* $(,)?]) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() {
                    let (store, _keep) = super::backends::$backend().await;
                    super::$test(store).await;
                }
            )*
        }
    };
}
