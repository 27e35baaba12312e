//! End-to-end tests: real `quiver` processes, real PostgreSQL.
