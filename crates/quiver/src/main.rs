//! `quiver`: one binary for the registry (control plane), the worker (data
//! plane), dev mode, the bundled example MCP server and the admin CLI. Flags can also be set with `QUIVER_<FLAG>` environment variables
//! and in a TOML config file (`--config`); flags win over env over file.

mod cmd;
mod config;
mod telemetry;

use clap::{Parser, Subcommand};

/// jemalloc with background threads (crate feature `background_threads`):
/// memory freed after a burst (thousands of connections shed by the
/// listeners, a large tool answer) goes back to the OS within its decay
/// time (`dirty_decay_ms`, 1 s: see .cargo/config.toml), where glibc's
/// malloc kept most of it.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "quiver",
    version,
    about = "MCP tools for fleets of LLM workers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the registry (control plane): gRPC, REST admin API, mcp.d bootstrap.
    Registry(cmd::registry::RegistryArgs),
    /// Run a worker (data plane): registry sync, MCP pool, tool API.
    Worker(cmd::worker::WorkerArgs),
    /// Run registry and worker in one process on the embedded SQLite store, without credentials.
    Dev(cmd::dev::DevArgs),
    /// Serve the bundled example MCP server over stdio.
    McpExample,
    /// MCP client tools: `quiver mcp probe URL` connects to a server (OAuth if it asks).
    Mcp(cmd::mcp_probe::McpArgs),
    /// Serve a worker's MCP endpoint on stdin/stdout (for clients that only launch stdio servers).
    McpStdio(cmd::mcp_stdio::McpStdioArgs),
    /// Manage MCP server records over gRPC.
    Servers(cmd::servers::ServersArgs),
}

/// Stack of each runtime thread. Tokio's 2 MiB is too little for the
/// deepest call path (gateway → tool runner → pool → connecting a per-user
/// OAuth grant) in a debug build, whose futures are many times their
/// release size; 8 MiB is address space, committed only as it is touched.
const THREAD_STACK_BYTES: usize = 8 * 1024 * 1024;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(THREAD_STACK_BYTES)
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(cli))
}

async fn run(cli: Cli) -> std::process::ExitCode {
    let result = match cli.command {
        Command::Registry(args) => cmd::registry::run(args).await,
        Command::Worker(args) => cmd::worker::run(args).await,
        Command::Dev(args) => cmd::dev::run(args).await,
        Command::McpExample => cmd::mcp_example::run().await,
        Command::McpStdio(args) => cmd::mcp_stdio::run(args).await,
        Command::Mcp(args) => cmd::mcp_probe::run(args).await,
        Command::Servers(args) => cmd::servers::run(args).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
