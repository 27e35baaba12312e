//! The task layer (layer 2): the operator's policy for one caller or task,
//! as configured and compiled.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::budget::{BudgetLimits, SessionBudgets};
use crate::naming::quote;
use crate::rate_limit::{CompiledRateLimit, RateLimit, check_max_concurrent, compile_rate_limits};
use crate::tool_search::ToolSearchSetting;
use crate::validate::is_valid_server_id;

use super::error::PolicyError;
use super::patterns::NamedPatterns;
use super::reject::RejectReason;

/// The operator's policy for one caller or task (layer 2), as configured.
///
/// The default allows every enabled server and narrows nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TaskPolicy {
    /// Servers this task may use; `None` means every enabled server, an
    /// empty list means none.
    pub allowed_server_ids: Option<Vec<String>>,
    /// Servers used when the request names none; `None` means all the task
    /// allows. Must be a subset of `allowed_server_ids`.
    pub default_server_ids: Option<Vec<String>>,
    /// Patterns over `<server_id>.<tool_name>`; empty: no further narrowing.
    #[serde(alias = "task_tool_allowlist")]
    pub tool_allowlist: Vec<String>,
    /// Patterns over `<server_id>.<tool_name>` that always remove.
    #[serde(alias = "task_tool_denylist")]
    pub tool_denylist: Vec<String>,
    /// Session budgets of the chat tool loop (`[tasks.<name>.budgets]`).
    pub budgets: BudgetLimits,
    /// Upstream model for every chat request of this task, whatever the
    /// request names.
    pub model: Option<String>,
    /// Requested model → upstream model, used when `model` is unset.
    pub models: BTreeMap<String, String>,
    /// Whether chat requests offer tool search instead of every tool,
    /// unless the request says otherwise (`mcp.tool_search`).
    pub tool_search: ToolSearchSetting,
    /// Whether chat requests show tool images to the model, unless the
    /// request says otherwise (`mcp.vision`).
    pub vision: bool,
    /// Tool calls allowed per window, counted across the fleet
    /// ([`crate::rate_limit`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rate_limits: Vec<RateLimit>,
    /// Calls one caller may have running at once on one worker.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent_calls: Option<u32>,
}

impl TaskPolicy {
    /// Checks and compiles the policy; errors name the offending field.
    pub fn compile(&self) -> Result<CompiledTaskPolicy, PolicyError> {
        let allowed_server_ids = server_id_set("allowed_server_ids", &self.allowed_server_ids)?;
        let default_server_ids = server_id_set("default_server_ids", &self.default_server_ids)?;
        if let (Some(allowed), Some(defaults)) = (&allowed_server_ids, &self.default_server_ids) {
            for (i, id) in defaults.iter().enumerate() {
                if !allowed.contains(id) {
                    return Err(PolicyError::DefaultNotAllowed {
                        field: format!("default_server_ids[{i}]"),
                        server_id: quote(id),
                    });
                }
            }
        }
        if self.model.as_deref().is_some_and(|m| m.trim().is_empty()) {
            return Err(PolicyError::EmptyModel {
                field: "model".into(),
            });
        }
        if let Some((from, _)) = self.models.iter().find(|(_, to)| to.trim().is_empty()) {
            return Err(PolicyError::EmptyModel {
                field: format!("models.{from}"),
            });
        }
        Ok(CompiledTaskPolicy {
            allowed_server_ids,
            default_server_ids,
            allowlist: NamedPatterns::for_field("tool_allowlist", &self.tool_allowlist)?,
            denylist: NamedPatterns::for_field("tool_denylist", &self.tool_denylist)?,
            budgets: SessionBudgets::for_task(&self.budgets)?,
            model: self.model.clone(),
            models: self.models.clone(),
            tool_search: self.tool_search.max_tools()?,
            vision: self.vision,
            rate_limits: compile_rate_limits(&self.rate_limits)?,
            max_concurrent_calls: check_max_concurrent(self.max_concurrent_calls)?,
        })
    }
}

/// A checked [`TaskPolicy`].
#[derive(Debug, Clone)]
pub struct CompiledTaskPolicy {
    allowed_server_ids: Option<BTreeSet<String>>,
    pub(super) default_server_ids: Option<BTreeSet<String>>,
    allowlist: NamedPatterns,
    denylist: NamedPatterns,
    budgets: SessionBudgets,
    model: Option<String>,
    models: BTreeMap<String, String>,
    tool_search: Option<u32>,
    vision: bool,
    rate_limits: Vec<CompiledRateLimit>,
    max_concurrent_calls: Option<u32>,
}

impl CompiledTaskPolicy {
    /// A policy that allows every enabled server and narrows nothing, e.g.
    /// for the registry's preview of what a record exposes.
    pub fn unrestricted() -> Self {
        CompiledTaskPolicy {
            allowed_server_ids: None,
            default_server_ids: None,
            allowlist: NamedPatterns::empty(),
            denylist: NamedPatterns::empty(),
            budgets: SessionBudgets::default(),
            model: None,
            models: BTreeMap::new(),
            tool_search: None,
            vision: false,
            rate_limits: Vec::new(),
            max_concurrent_calls: None,
        }
    }

    /// The task's rate limits, in the order configured.
    pub fn rate_limits(&self) -> &[CompiledRateLimit] {
        &self.rate_limits
    }

    /// Calls one caller may have running at once on one worker.
    pub fn max_concurrent_calls(&self) -> Option<u32> {
        self.max_concurrent_calls
    }

    /// Whether chat requests show tool images to the model by default.
    pub fn vision(&self) -> bool {
        self.vision
    }

    /// Tools offered with tool search by default (`None`: search is off).
    pub fn tool_search(&self) -> Option<u32> {
        self.tool_search
    }

    /// The task's session budgets.
    pub fn budgets(&self) -> &SessionBudgets {
        &self.budgets
    }

    /// The model to ask the upstream for when a request names `requested`:
    /// the task's override, else its mapping; `None` keeps the request's.
    pub fn upstream_model(&self, requested: Option<&str>) -> Option<&str> {
        self.model
            .as_deref()
            .or_else(|| requested.and_then(|name| self.models.get(name).map(String::as_str)))
    }

    /// Whether the task may use `server_id` at all.
    pub fn allows_server(&self, server_id: &str) -> bool {
        self.allowed_server_ids
            .as_ref()
            .is_none_or(|ids| ids.contains(server_id))
    }

    pub(super) fn check_tool(&self, qualified: &str) -> Result<(), RejectReason> {
        if let Some(pattern) = self.denylist.first_match(qualified) {
            return Err(RejectReason::DeniedByTask { pattern });
        }
        if !self.allowlist.is_empty() && !self.allowlist.matches(qualified) {
            return Err(RejectReason::NotInTaskAllowlist);
        }
        Ok(())
    }
}

pub(super) fn server_id_set(
    field: &str,
    ids: &Option<Vec<String>>,
) -> Result<Option<BTreeSet<String>>, PolicyError> {
    let Some(ids) = ids else {
        return Ok(None);
    };
    for (i, id) in ids.iter().enumerate() {
        if !is_valid_server_id(id) {
            return Err(PolicyError::InvalidServerId {
                field: format!("{field}[{i}]"),
                server_id: quote(id),
            });
        }
    }
    Ok(Some(ids.iter().cloned().collect()))
}
