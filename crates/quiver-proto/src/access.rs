//! Conversions of access records (`quiver_model::access`) to and from
//! their protobuf form, which carries each record's JSON.

use quiver_model::access::{AccessKind, AccessSpec, StoredAccess};

use crate::v1 as pb;
use crate::{ConversionError, from_timestamp, timestamp};

impl From<AccessKind> for pb::AccessKind {
    fn from(kind: AccessKind) -> Self {
        match kind {
            AccessKind::Policy => pb::AccessKind::Policy,
            AccessKind::ApiKey => pb::AccessKind::ApiKey,
            AccessKind::IdentityProvider => pb::AccessKind::IdentityProvider,
        }
    }
}

/// The access kind of a protobuf enum value.
pub fn access_kind_from(value: i32) -> Result<AccessKind, ConversionError> {
    match pb::AccessKind::try_from(value) {
        Ok(pb::AccessKind::Policy) => Ok(AccessKind::Policy),
        Ok(pb::AccessKind::ApiKey) => Ok(AccessKind::ApiKey),
        Ok(pb::AccessKind::IdentityProvider) => Ok(AccessKind::IdentityProvider),
        _ => Err(ConversionError::new(
            "kind",
            format!("unknown access kind {value}"),
        )),
    }
}

impl From<&StoredAccess> for pb::AccessRecord {
    fn from(record: &StoredAccess) -> Self {
        pb::AccessRecord {
            kind: pb::AccessKind::from(record.spec.kind()).into(),
            name: record.spec.name().to_owned(),
            // An AccessSpec is plain data: serializing it cannot fail.
            spec_json: serde_json::to_string(&record.spec).unwrap_or_default(),
            revision: record.revision,
            updated_at: Some(timestamp(record.updated_at)),
            updated_by: record.updated_by.clone(),
            source: record.source.to_string(),
        }
    }
}

impl TryFrom<pb::AccessRecord> for StoredAccess {
    type Error = ConversionError;

    fn try_from(record: pb::AccessRecord) -> Result<Self, Self::Error> {
        let kind = access_kind_from(record.kind)?;
        let spec: AccessSpec = serde_json::from_str(&record.spec_json)
            .map_err(|err| ConversionError::new("spec_json", err.to_string()))?;
        if spec.kind() != kind || spec.name() != record.name {
            return Err(ConversionError::new(
                "spec_json",
                format!(
                    "holds {} {:?}, not {kind} {:?}",
                    spec.kind(),
                    spec.name(),
                    record.name
                ),
            ));
        }
        let updated_at = from_timestamp("updated_at", record.updated_at)?;
        Ok(StoredAccess {
            spec,
            revision: record.revision,
            created_at: updated_at,
            updated_at,
            updated_by: record.updated_by,
            source: record
                .source
                .parse()
                .map_err(|err: quiver_model::UnknownSource| {
                    ConversionError::new("source", err.to_string())
                })?,
        })
    }
}

impl From<(AccessKind, &str)> for pb::AccessRef {
    fn from((kind, name): (AccessKind, &str)) -> Self {
        pb::AccessRef {
            kind: pb::AccessKind::from(kind).into(),
            name: name.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};
    use quiver_model::Source;
    use quiver_model::access::PolicyRecord;

    #[test]
    fn a_record_survives_a_round_trip_and_a_mismatch_is_named() {
        let at = Utc.timestamp_millis_opt(1_700_000_000_000).unwrap();
        let stored = StoredAccess {
            spec: AccessSpec::Policy(PolicyRecord {
                name: "team-a".into(),
                policy: Default::default(),
            }),
            revision: 7,
            created_at: at,
            updated_at: at,
            updated_by: "admin".into(),
            source: Source::Admin,
        };
        let message = pb::AccessRecord::from(&stored);
        assert_eq!(StoredAccess::try_from(message.clone()).unwrap(), stored);
        let wrong = pb::AccessRecord {
            name: "team-b".into(),
            ..message
        };
        assert_eq!(
            StoredAccess::try_from(wrong).unwrap_err().field(),
            "spec_json"
        );
    }
}
