//! The test MCP server, under the path tests have always used: it lives in
//! `quiver-example-mcp` (the product's `quiver mcp-example` serves the same
//! server), whose stdio ([`quiver_example_mcp::server`]) and Streamable HTTP
//! ([`quiver_example_mcp::http`]) parts are re-exported here as one module;
//! [`testkit_mcp_bin`] finds it built as a process of its own.

use std::path::PathBuf;

pub use quiver_example_mcp::http::*;
pub use quiver_example_mcp::server::*;

/// The `quiver-testkit-mcp` binary, for tests that need the server as a
/// real child process. Test binaries live in `target/<profile>/deps/`,
/// binaries in `target/<profile>/`.
///
/// # Panics
/// When it has not been built (`cargo build -p quiver-testkit`).
pub fn testkit_mcp_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let path = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("target dir")
        .join("quiver-testkit-mcp");
    assert!(
        path.is_file(),
        "{} is missing; build it: cargo build -p quiver-testkit",
        path.display()
    );
    path
}
