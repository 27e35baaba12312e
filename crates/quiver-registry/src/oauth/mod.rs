//! The registry's OAuth connections (docs/reference.md §13.6): settings
//! ([`spec`]), encryption at rest ([`seal`]) and the broker that runs the
//! flows and hands workers access tokens ([`broker`]).

pub mod broker;
pub mod egress;
pub mod rest;
pub mod seal;
pub mod spec;
