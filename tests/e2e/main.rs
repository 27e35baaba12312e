//! End-to-end tests: real `quiver` processes, real PostgreSQL, real MCP
//! servers (`quiver-testkit-mcp`).
//!
//! Every test spawns its own `quiver registry` processes on ephemeral
//! loopback ports (see [`harness`]) over a fresh database: a PostgreSQL
//! database from `quiver_testkit` (dropped afterwards) or a SQLite file in a
//! temporary directory. Nothing depends on state left by other tests or runs.

mod access;
mod approvals;
mod artifacts;
mod auth;
mod chat;
mod cli_and_bootstrap;
mod conformance_client;
mod conformance_server;
mod crash_safety;
mod deployment;
mod faults;
mod gateway;
mod gateway_2026;
mod graceful_shutdown;
mod harness;
mod hostile_calls;
mod hostile_output;
mod hostile_servers;
mod identity;
mod kubernetes;
mod listeners;
mod metrics;
mod multi_host;
mod oauth;
mod oauth_consent_browser;
mod oauth_per_user;
mod openai_sdk;
mod otlp;
mod quotas;
mod registry_concurrency;
mod replicas;
mod repo_rules;
mod resource_uris;
mod security;
mod server_json;
mod sessions;
mod stack;
mod tls;
mod tool_search;
mod upstream_2026;
mod usage_browser;
mod web_admin;
mod web_admin_scale;
mod worker;
