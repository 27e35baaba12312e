//! The record layer (layer 1): a record's tool, resource and prompt lists,
//! compiled.

use crate::pattern::{PatternError, PatternSet};
use crate::record::McpServerSpec;
use crate::resource_uri::{ResourcePatterns, UriRefusal};

use super::patterns::NamedPatterns;
use super::reject::RejectReason;

/// A record's `allowed_tools` / `denied_tools`, compiled (layer 1).
#[derive(Debug, Clone)]
pub struct ServerToolFilter {
    allowed: NamedPatterns,
    denied: NamedPatterns,
}

impl ServerToolFilter {
    /// Compiles the record's lists. Stored records were validated, so this
    /// only fails for a record that skipped validation.
    pub fn new(spec: &McpServerSpec) -> Result<Self, PatternError> {
        Ok(ServerToolFilter {
            allowed: NamedPatterns::new(&spec.allowed_tools)?,
            denied: NamedPatterns::new(&spec.denied_tools)?,
        })
    }

    /// Whether the raw tool name passes this layer; deny wins over allow.
    pub fn check(&self, tool_name: &str) -> Result<(), RejectReason> {
        if let Some(pattern) = self.denied.first_match(tool_name) {
            return Err(RejectReason::DeniedByServer { pattern });
        }
        if !self.allowed.matches(tool_name) {
            return Err(RejectReason::NotInAllowedTools);
        }
        Ok(())
    }
}

/// A record's `allowed_resources` and `allowed_prompts`, compiled: which of
/// the server's resources and prompts callers may use besides its tools.
///
/// Resource patterns match the whole URI as the server lists it and prompt
/// patterns the prompt name, both case-sensitively, with the syntax of
/// [`crate::pattern`] (`*` matches any substring, `/` included). A URI with
/// a dot segment, control character, backslash or malformed encoding is
/// refused before matching ([`crate::resource_uri`]). An empty list allows
/// nothing. This is the only layer for resources and prompts; whether the
/// server itself may be used is [`server_selected`](super::server_selected)'s decision.
#[derive(Debug, Clone)]
pub struct ServerContentFilter {
    resources: ResourcePatterns,
    prompts: PatternSet,
}

impl ServerContentFilter {
    /// Compiles the record's lists. Stored records were validated, so this
    /// only fails for a record that skipped validation.
    pub fn new(spec: &McpServerSpec) -> Result<Self, PatternError> {
        Ok(ServerContentFilter {
            resources: ResourcePatterns::new(&spec.allowed_resources)?,
            prompts: PatternSet::new(&spec.allowed_prompts)?,
        })
    }

    /// Whether the resource at `uri` may be listed and read.
    pub fn allows_resource(&self, uri: &str) -> bool {
        self.resources.matches(uri)
    }

    /// Why `uri` is refused whatever `allowed_resources` says
    /// ([`crate::resource_uri::check`]), or whether a pattern allows it.
    pub fn judge_resource(&self, uri: &str) -> Result<bool, UriRefusal> {
        self.resources.judge(uri)
    }

    /// Whether the prompt `name` may be listed and got.
    pub fn allows_prompt(&self, name: &str) -> bool {
        self.prompts.matches(name)
    }
}
