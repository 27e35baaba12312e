//! A fresh PostgreSQL database per test, dropped when the test ends.
//!
//! The server comes from `QUIVER_TEST_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`, the trust-auth server of the
//! development and CI machines); each [`TestDatabase`] creates its own
//! uniquely named database there, so tests never see each other's state or
//! anything left by an earlier run.

use sqlx::{Connection, Executor, PgConnection};

/// Environment variable naming the PostgreSQL server used by tests.
pub const DATABASE_URL_ENV: &str = "QUIVER_TEST_DATABASE_URL";
/// The server used when the variable is unset.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A database that exists for the lifetime of this value.
pub struct TestDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl TestDatabase {
    /// Creates an empty database on the test server.
    ///
    /// # Panics
    /// When the server cannot be reached: a test that needs PostgreSQL must
    /// fail loudly, never pass by skipping.
    pub async fn create() -> Self {
        let admin_url =
            std::env::var(DATABASE_URL_ENV).unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned());
        let name = format!(
            "quiver_test_{}_{:016x}",
            std::process::id(),
            rand::random::<u64>()
        );
        let mut conn = PgConnection::connect(&admin_url)
            .await
            .unwrap_or_else(|err| panic!("cannot reach PostgreSQL at {admin_url}: {err}"));
        conn.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .await
            .unwrap_or_else(|err| panic!("cannot create test database {name}: {err}"));
        let url = match admin_url.rsplit_once('/') {
            Some((server, _)) => format!("{server}/{name}"),
            None => panic!("{DATABASE_URL_ENV} must end with /<database>"),
        };
        TestDatabase {
            admin_url,
            name,
            url,
        }
    }

    /// URL of the fresh database.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let statement = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name);
        // Drop may run inside a runtime; use a thread with its own.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let mut conn = PgConnection::connect(&admin_url).await.ok()?;
                conn.execute(sqlx::AssertSqlSafe(statement)).await.ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(_))) {
            eprintln!("warning: test database {} was not dropped", self.name);
        }
    }
}
