//! The registry's OAuth connections (docs/reference.md §13.6): settings
//! ([`spec`]), encryption at rest ([`seal`]) and the broker that runs the
//! flows and hands workers access tokens ([`broker`]). Their admin API and
//! the browser's pages are `rest::oauth`.

pub mod broker;
pub mod egress;
pub mod seal;
pub mod spec;
