//! Session budgets of the chat tool loop (R-CHAT-3): how many model turns
//! may run MCP tools, how many MCP calls and how many bytes of tool output
//! one chat request may use in total.
//!
//! The operator sets them per task; a request may lower them for itself but
//! never raise them.

use serde::{Deserialize, Serialize};

/// Limits of one chat request, all at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SessionBudgets {
    /// Model turns whose MCP tool calls are run.
    pub max_iterations: u32,
    /// MCP tool calls run in total.
    pub max_total_tool_calls: u32,
    /// Bytes of tool output handed to the model in total.
    pub max_tool_output_bytes: u64,
}

impl Default for SessionBudgets {
    /// 10 turns, 50 calls, 1 MiB of tool output.
    fn default() -> Self {
        SessionBudgets {
            max_iterations: 10,
            max_total_tool_calls: 50,
            max_tool_output_bytes: 1024 * 1024,
        }
    }
}

/// Budgets as written (task config or request); unset ones are inherited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BudgetLimits {
    /// See [`SessionBudgets::max_iterations`].
    pub max_iterations: Option<u32>,
    /// See [`SessionBudgets::max_total_tool_calls`].
    pub max_total_tool_calls: Option<u32>,
    /// See [`SessionBudgets::max_tool_output_bytes`].
    pub max_tool_output_bytes: Option<u64>,
}

/// A budget that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    /// Zero would disable MCP tools; use the server lists for that.
    #[error("{field}: must be at least 1")]
    Zero {
        /// The budget.
        field: &'static str,
    },
    /// A request asked for more than its task allows.
    #[error(
        "{field}: {requested} exceeds this caller's limit of {allowed}; the request cannot widen the task policy"
    )]
    AboveTask {
        /// The budget.
        field: &'static str,
        /// What the request asked for.
        requested: u64,
        /// The task's limit.
        allowed: u64,
    },
}

impl BudgetError {
    /// The budget this error is about.
    pub fn field(&self) -> &'static str {
        match self {
            BudgetError::Zero { field } | BudgetError::AboveTask { field, .. } => field,
        }
    }
}

impl SessionBudgets {
    /// The task's budgets: `limits` over the defaults.
    pub fn for_task(limits: &BudgetLimits) -> Result<Self, BudgetError> {
        SessionBudgets::default().apply(limits, false)
    }

    /// These budgets lowered by a request; asking for more is an error, so a
    /// caller learns that it did not get what it asked for.
    pub fn narrowed(&self, request: &BudgetLimits) -> Result<Self, BudgetError> {
        self.apply(request, true)
    }

    fn apply(&self, limits: &BudgetLimits, cap: bool) -> Result<Self, BudgetError> {
        fn pick(
            field: &'static str,
            current: u64,
            wanted: Option<u64>,
            cap: bool,
        ) -> Result<u64, BudgetError> {
            match wanted {
                None => Ok(current),
                Some(0) => Err(BudgetError::Zero { field }),
                Some(requested) if cap && requested > current => Err(BudgetError::AboveTask {
                    field,
                    requested,
                    allowed: current,
                }),
                Some(wanted) => Ok(wanted),
            }
        }
        let as_u32 = |value: u64| u32::try_from(value).unwrap_or(u32::MAX);
        Ok(SessionBudgets {
            max_iterations: as_u32(pick(
                "max_iterations",
                self.max_iterations.into(),
                limits.max_iterations.map(u64::from),
                cap,
            )?),
            max_total_tool_calls: as_u32(pick(
                "max_total_tool_calls",
                self.max_total_tool_calls.into(),
                limits.max_total_tool_calls.map(u64::from),
                cap,
            )?),
            max_tool_output_bytes: pick(
                "max_tool_output_bytes",
                self.max_tool_output_bytes,
                limits.max_tool_output_bytes,
                cap,
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_limits_replace_defaults_and_requests_only_lower() {
        let task = SessionBudgets::for_task(&BudgetLimits {
            max_iterations: Some(3),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(task.max_iterations, 3);
        assert_eq!(
            task.max_total_tool_calls,
            SessionBudgets::default().max_total_tool_calls
        );
        // A task may also raise the defaults.
        let generous = SessionBudgets::for_task(&BudgetLimits {
            max_total_tool_calls: Some(500),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(generous.max_total_tool_calls, 500);

        let lowered = task
            .narrowed(&BudgetLimits {
                max_iterations: Some(2),
                max_tool_output_bytes: Some(100),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(
            (lowered.max_iterations, lowered.max_tool_output_bytes),
            (2, 100)
        );
        assert_eq!(task.narrowed(&BudgetLimits::default()).unwrap(), task);

        let err = task
            .narrowed(&BudgetLimits {
                max_iterations: Some(4),
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!(err.field(), "max_iterations");
        assert!(err.to_string().contains("exceeds this caller's limit of 3"));
    }

    #[test]
    fn zero_is_refused_with_the_field() {
        for limits in [
            BudgetLimits {
                max_iterations: Some(0),
                ..Default::default()
            },
            BudgetLimits {
                max_total_tool_calls: Some(0),
                ..Default::default()
            },
            BudgetLimits {
                max_tool_output_bytes: Some(0),
                ..Default::default()
            },
        ] {
            let err = SessionBudgets::for_task(&limits).unwrap_err();
            assert!(matches!(err, BudgetError::Zero { .. }));
            assert!(err.to_string().starts_with(err.field()));
            assert!(SessionBudgets::default().narrowed(&limits).is_err());
        }
    }
}
