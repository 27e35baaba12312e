//! One module per subcommand, plus what several of them share: flag groups
//! (`flags`) and signal handling (`signals`).

pub mod dev;
pub mod flags;
pub mod mcp_example;
pub mod mcp_probe;
pub mod mcp_stdio;
pub mod registry;
pub mod servers;
pub mod signals;
pub mod worker;
