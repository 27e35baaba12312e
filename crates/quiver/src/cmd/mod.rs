//! One module per subcommand.

pub mod dev;
pub mod mcp_example;
pub mod registry;
pub mod servers;
pub mod worker;
