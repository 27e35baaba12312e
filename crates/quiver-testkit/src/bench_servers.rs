//! Where benchmarks find the MCP servers they measure: the testkit's own
//! binary of the build profile being benchmarked, and the reference server
//! `@modelcontextprotocol/server-everything`, installed with npm on first
//! use.

use std::path::PathBuf;
use std::process::Stdio;

use serde_json::Value;

/// A benchmark's error.
pub type BenchError = Box<dyn std::error::Error + Send + Sync>;

/// The pinned version of `@modelcontextprotocol/server-everything`.
pub const EVERYTHING_VERSION: &str = "2026.8.31";
/// The npm package of the reference server.
pub const EVERYTHING_PACKAGE: &str = "@modelcontextprotocol/server-everything";

/// The `quiver-testkit-mcp` binary of this build profile: benches run from
/// `target/<profile>/deps/`, binaries live in `target/<profile>/`.
pub fn server_binary() -> Result<PathBuf, BenchError> {
    let binary = match std::env::var_os("QUIVER_BENCH_MCP_BIN") {
        Some(path) => PathBuf::from(path),
        None => std::env::current_exe()?
            .parent()
            .and_then(|deps| deps.parent())
            .ok_or("cannot locate the target directory from the benchmark's path")?
            .join("quiver-testkit-mcp"),
    };
    if !binary.is_file() {
        return Err(format!(
            "{} not found: build it first with `cargo build --release -p quiver-testkit` \
             (or point QUIVER_BENCH_MCP_BIN at it)",
            binary.display()
        )
        .into());
    }
    Ok(binary)
}

/// `QUIVER_BENCH_NODE`, else the first `node` in `PATH`, as an absolute path
/// (the pool starts stdio children with a minimal environment).
pub fn node_binary() -> Result<PathBuf, BenchError> {
    if let Some(path) = std::env::var_os("QUIVER_BENCH_NODE") {
        return Ok(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("node"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| "node not found in PATH (or set QUIVER_BENCH_NODE)".into())
}

/// The version in a `package.json`, if the file is there.
fn package_version(package_json: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(package_json).ok()?;
    let manifest: Value = serde_json::from_str(&text).ok()?;
    manifest["version"].as_str().map(str::to_owned)
}

/// The entry script of the pinned server-everything and the version of the
/// MCP SDK it resolved to; installs the package with npm into
/// `target/bench-npm` (or `QUIVER_BENCH_NPM_PREFIX`) when that version is
/// not there yet.
pub fn everything_entry() -> Result<(PathBuf, String), BenchError> {
    let prefix = match std::env::var_os("QUIVER_BENCH_NPM_PREFIX") {
        Some(path) => PathBuf::from(path),
        // target/<profile>/deps/<bench> → target/bench-npm
        None => std::env::current_exe()?
            .ancestors()
            .nth(3)
            .ok_or("cannot locate the target directory from the benchmark's path")?
            .join("bench-npm"),
    };
    let package = prefix.join("node_modules").join(EVERYTHING_PACKAGE);
    let installed = || package_version(&package.join("package.json"));
    if installed().as_deref() != Some(EVERYTHING_VERSION) {
        eprintln!(
            "installing {EVERYTHING_PACKAGE}@{EVERYTHING_VERSION} into {}",
            prefix.display()
        );
        std::fs::create_dir_all(&prefix)?;
        let status = std::process::Command::new("npm")
            .arg("install")
            .arg("--prefix")
            .arg(&prefix)
            .args(["--no-audit", "--no-fund", "--save-exact"])
            .arg(format!("{EVERYTHING_PACKAGE}@{EVERYTHING_VERSION}"))
            .stdin(Stdio::null())
            .stdout(std::io::stderr())
            .status()?;
        if !status.success() {
            return Err(format!("npm install failed: {status}").into());
        }
        if installed().as_deref() != Some(EVERYTHING_VERSION) {
            return Err(format!(
                "{} does not hold {EVERYTHING_PACKAGE}@{EVERYTHING_VERSION} after npm install",
                prefix.display()
            )
            .into());
        }
    }
    let entry = package.join("dist").join("index.js");
    if !entry.is_file() {
        return Err(format!("{} not found", entry.display()).into());
    }
    // The SDK is nested in the package or hoisted next to it.
    let sdk = [package.as_path(), &prefix]
        .iter()
        .find_map(|base| {
            package_version(&base.join("node_modules/@modelcontextprotocol/sdk/package.json"))
        })
        .unwrap_or_else(|| "unknown".into());
    Ok((entry, sdk))
}
