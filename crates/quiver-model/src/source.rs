//! Who wrote a record (R-REC-2): the admin, the API or a file. Server
//! records and access records both carry it, so it sits below both.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Where a record's current content came from (R-REC-2).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// The web admin or REST admin API.
    Admin,
    /// The gRPC API (the `quiver servers` CLI, automation).
    Api,
    /// A file of the `mcp.d` directory, by file name.
    File(String),
}

impl Source {
    /// Whether a write from this source takes over a record whose content it
    /// does not change. Files do (a record moved between files changes owner);
    /// admin and API writes of identical content are no-ops, so an admin who
    /// saves an unchanged form does not detach a record from its file.
    pub fn adopts_identical_record(&self) -> bool {
        matches!(self, Source::File(_))
    }

    /// The file name for file sources.
    pub fn file_name(&self) -> Option<&str> {
        match self {
            Source::File(name) => Some(name),
            _ => None,
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Admin => f.write_str("admin"),
            Source::Api => f.write_str("api"),
            Source::File(name) => write!(f, "file:{name}"),
        }
    }
}

/// A source string that is none of `admin`, `api`, `file:<name>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown record source {0:?}")]
pub struct UnknownSource(pub String);

impl FromStr for Source {
    type Err = UnknownSource;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "admin" => Ok(Source::Admin),
            "api" => Ok(Source::Api),
            _ => match s.strip_prefix("file:") {
                Some(name) if !name.is_empty() => Ok(Source::File(name.to_owned())),
                _ => Err(UnknownSource(s.to_owned())),
            },
        }
    }
}

impl Serialize for Source {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Source {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_round_trips() {
        for source in [
            Source::Admin,
            Source::Api,
            Source::File("10-fs.toml".into()),
        ] {
            assert_eq!(source.to_string().parse::<Source>().unwrap(), source);
        }
        assert!("file:".parse::<Source>().is_err());
        assert!("root".parse::<Source>().is_err());
    }
}
