//! Conversions of approvals (docs/reference.md §13.7) between
//! `quiver_model::approval` and `quiver.registry.v1`.

use quiver_model::approval::{
    Approval, ApprovalBinding, ApprovalState, BindingField, UseOutcome, arguments_from_json,
};

use crate::v1 as pb;
use crate::{ConversionError, from_timestamp, timestamp};

impl From<ApprovalState> for pb::ApprovalState {
    fn from(state: ApprovalState) -> Self {
        match state {
            ApprovalState::Pending => pb::ApprovalState::Pending,
            ApprovalState::Approved => pb::ApprovalState::Approved,
            ApprovalState::Denied => pb::ApprovalState::Denied,
            ApprovalState::Used => pb::ApprovalState::Used,
            ApprovalState::Expired => pb::ApprovalState::Expired,
        }
    }
}

fn state_from(value: i32) -> Result<ApprovalState, ConversionError> {
    match pb::ApprovalState::try_from(value) {
        Ok(pb::ApprovalState::Pending) => Ok(ApprovalState::Pending),
        Ok(pb::ApprovalState::Approved) => Ok(ApprovalState::Approved),
        Ok(pb::ApprovalState::Denied) => Ok(ApprovalState::Denied),
        Ok(pb::ApprovalState::Used) => Ok(ApprovalState::Used),
        Ok(pb::ApprovalState::Expired) => Ok(ApprovalState::Expired),
        _ => Err(ConversionError::new(
            "state",
            format!("unknown approval state {value}"),
        )),
    }
}

fn empty_is_none(text: String) -> Option<String> {
    (!text.is_empty()).then_some(text)
}

impl From<&Approval> for pb::Approval {
    fn from(approval: &Approval) -> Self {
        pb::Approval {
            approval_id: approval.approval_id.clone(),
            state: pb::ApprovalState::from(approval.state).into(),
            task: approval.binding.task.clone(),
            server_id: approval.binding.server_id.clone(),
            tool: approval.binding.tool.clone(),
            arguments_json: approval.arguments.to_string(),
            arguments_hash: approval.binding.arguments_hash.clone(),
            record_revision: approval.binding.record_revision,
            requested_by: approval.requested_by.clone(),
            requested_at: Some(timestamp(approval.requested_at)),
            expires_at: Some(timestamp(approval.expires_at)),
            decided_by: approval.decided_by.clone().unwrap_or_default(),
            decided_at: approval.decided_at.map(timestamp),
            note: approval.note.clone().unwrap_or_default(),
            used_at: approval.used_at.map(timestamp),
            used_by: approval.used_by.clone().unwrap_or_default(),
        }
    }
}

impl TryFrom<pb::Approval> for Approval {
    type Error = ConversionError;

    fn try_from(approval: pb::Approval) -> Result<Self, Self::Error> {
        let optional_time = |field: &str, ts: Option<prost_types::Timestamp>| {
            ts.map(|ts| from_timestamp(field, Some(ts))).transpose()
        };
        Ok(Approval {
            state: state_from(approval.state)?,
            binding: ApprovalBinding {
                task: approval.task,
                server_id: approval.server_id,
                tool: approval.tool,
                arguments_hash: approval.arguments_hash,
                record_revision: approval.record_revision,
            },
            arguments: arguments_from_json(&approval.arguments_json)
                .map_err(|err| ConversionError::new("arguments_json", err.to_string()))?,
            requested_by: approval.requested_by,
            requested_at: from_timestamp("requested_at", approval.requested_at)?,
            expires_at: from_timestamp("expires_at", approval.expires_at)?,
            decided_by: empty_is_none(approval.decided_by),
            decided_at: optional_time("decided_at", approval.decided_at)?,
            note: empty_is_none(approval.note),
            used_at: optional_time("used_at", approval.used_at)?,
            used_by: empty_is_none(approval.used_by),
            approval_id: approval.approval_id,
        })
    }
}

/// A use outcome as the `outcome` and `mismatch_field` of a
/// `UseApprovalResponse`.
pub fn use_outcome_to(outcome: UseOutcome) -> (pb::UseApprovalOutcome, String) {
    let plain = |o| (o, String::new());
    match outcome {
        UseOutcome::Used => plain(pb::UseApprovalOutcome::Used),
        UseOutcome::NotFound => plain(pb::UseApprovalOutcome::NotFound),
        UseOutcome::Pending => plain(pb::UseApprovalOutcome::Pending),
        UseOutcome::Denied => plain(pb::UseApprovalOutcome::Denied),
        UseOutcome::AlreadyUsed => plain(pb::UseApprovalOutcome::AlreadyUsed),
        UseOutcome::Expired => plain(pb::UseApprovalOutcome::Expired),
        UseOutcome::Mismatch(field) => {
            (pb::UseApprovalOutcome::Mismatch, field.as_str().to_owned())
        }
    }
}

/// The use outcome a `UseApprovalResponse` carries.
pub fn use_outcome_from(outcome: i32, mismatch_field: &str) -> Result<UseOutcome, ConversionError> {
    Ok(match pb::UseApprovalOutcome::try_from(outcome) {
        Ok(pb::UseApprovalOutcome::Used) => UseOutcome::Used,
        Ok(pb::UseApprovalOutcome::NotFound) => UseOutcome::NotFound,
        Ok(pb::UseApprovalOutcome::Pending) => UseOutcome::Pending,
        Ok(pb::UseApprovalOutcome::Denied) => UseOutcome::Denied,
        Ok(pb::UseApprovalOutcome::AlreadyUsed) => UseOutcome::AlreadyUsed,
        Ok(pb::UseApprovalOutcome::Expired) => UseOutcome::Expired,
        Ok(pb::UseApprovalOutcome::Mismatch) => UseOutcome::Mismatch(
            BindingField::ALL
                .into_iter()
                .find(|field| field.as_str() == mismatch_field)
                .ok_or_else(|| {
                    ConversionError::new(
                        "mismatch_field",
                        format!("unknown field {mismatch_field:?}"),
                    )
                })?,
        ),
        _ => {
            return Err(ConversionError::new(
                "outcome",
                format!("unknown use outcome {outcome}"),
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    #[test]
    fn approvals_round_trip() {
        let approval = Approval {
            approval_id: "apr_1".into(),
            state: ApprovalState::Approved,
            binding: ApprovalBinding {
                task: "t".into(),
                server_id: "s".into(),
                tool: "x".into(),
                arguments_hash: "h".into(),
                record_revision: 7,
            },
            arguments: arguments_from_json(r#"{"a": [1, "b"]}"#).unwrap(),
            requested_by: "worker".into(),
            requested_at: Utc.timestamp_millis_opt(1_000).unwrap(),
            expires_at: Utc.timestamp_millis_opt(2_000).unwrap(),
            decided_by: Some("admin".into()),
            decided_at: Some(Utc.timestamp_millis_opt(1_500).unwrap()),
            note: None,
            used_at: None,
            used_by: None,
        };
        let back = Approval::try_from(pb::Approval::from(&approval)).unwrap();
        assert_eq!(back, approval);
        for outcome in [
            UseOutcome::Used,
            UseOutcome::Expired,
            UseOutcome::Mismatch(BindingField::ArgumentsHash),
        ] {
            let (wire, field) = use_outcome_to(outcome);
            assert_eq!(use_outcome_from(wire.into(), &field).unwrap(), outcome);
        }
    }
}
