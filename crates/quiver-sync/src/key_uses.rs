//! API keys used on this worker since its last status report, so the
//! registry can show each key's `last_used_at` (docs/reference.md §12.2).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use quiver_proto::v1 as pb;

/// Distinct keys remembered between two reports; more are dropped until
/// the next report (a report carries at most this many).
pub const MAX_KEY_USES: usize = 10_000;

/// Records key uses; cheap to clone.
#[derive(Clone, Default)]
pub struct KeyUses {
    used: Arc<Mutex<HashMap<Arc<str>, SystemTime>>>,
}

impl KeyUses {
    /// Notes that key `id` was used now.
    pub fn record(&self, id: &Arc<str>) {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        if used.len() < MAX_KEY_USES || used.contains_key(id) {
            used.insert(id.clone(), SystemTime::now());
        }
    }

    /// Takes the uses recorded so far.
    pub(crate) fn take(&self) -> Vec<pb::ApiKeyUse> {
        let used = std::mem::take(&mut *self.used.lock().unwrap_or_else(|p| p.into_inner()));
        used.into_iter()
            .map(|(id, at)| pb::ApiKeyUse {
                key_id: id.to_string(),
                last_used_at: Some(prost_types::Timestamp::from(at)),
            })
            .collect()
    }

    /// Puts back uses a failed report did not deliver (newer ones win).
    pub(crate) fn restore(&self, uses: Vec<pb::ApiKeyUse>) {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        for key_use in uses {
            let Some(at) = key_use
                .last_used_at
                .and_then(|t| SystemTime::try_from(t).ok())
            else {
                continue;
            };
            if used.len() >= MAX_KEY_USES {
                break;
            }
            used.entry(key_use.key_id.into()).or_insert(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uses_are_taken_once_and_restored_after_a_failure() {
        let uses = KeyUses::default();
        let id: Arc<str> = "k1".into();
        uses.record(&id);
        uses.record(&id);
        let taken = uses.take();
        assert_eq!(taken.len(), 1);
        assert!(uses.take().is_empty());
        uses.restore(taken);
        assert_eq!(uses.take()[0].key_id, "k1");
    }
}
