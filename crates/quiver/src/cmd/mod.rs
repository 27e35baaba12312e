//! One module per subcommand.

pub mod dev;
pub mod registry;
pub mod servers;
