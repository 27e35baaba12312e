//! Comparing a `policies.d` scan with the store, rendering the difference
//! (`--dry-run`) and writing it in an order the store's reference checks
//! accept.

use std::collections::{BTreeMap, BTreeSet};

use quiver_model::Source;
use quiver_model::access::{AccessKind, AccessSpec, IdentityProviderRecord, StoredAccess};
use quiver_model::policy::TaskPolicy;
use quiver_store::{AccessDelete, AccessOutcome, AccessPut, Store, StoreError};
use serde::Serialize;

use super::scan::{AccessFileRecord, PolicyScan};
use crate::BootstrapError;
use crate::plan::{ApplyReport, Decision, Render, decide};

/// The kinds a `policies.d` file holds; API keys are never read from files
/// (nor touched by a rescan).
const FILE_KINDS: [AccessKind; 2] = [AccessKind::Policy, AccessKind::IdentityProvider];

/// How messages name a record: `policy team-a`, `identity_provider corp`.
pub fn describe(kind: AccessKind, name: &str) -> String {
    format!("{kind} {name}")
}

/// What a rescan does with one policy or identity provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessAction {
    /// A file declares a record the store lacks.
    Create {
        /// The declaring file.
        file: String,
        /// The declared record.
        spec: AccessSpec,
    },
    /// A file-owned record whose content or owning file changes.
    Update {
        /// The declaring file, the record's new source.
        file: String,
        /// The record as stored when planning.
        current: Box<StoredAccess>,
        /// The declared record.
        spec: AccessSpec,
    },
    /// A file-owned record no valid file declares any more.
    Delete {
        /// The record as stored when planning.
        current: Box<StoredAccess>,
        /// Why, e.g. `file 30-old.toml removed`.
        reason: String,
    },
    /// The store already holds exactly what the file declares.
    Unchanged {
        /// The record's kind.
        kind: AccessKind,
        /// Its name.
        name: String,
        /// The declaring file.
        file: String,
    },
    /// A file's declaration that is not applied: the record is managed by
    /// admin, owned by an invalid file, or names a policy that will not
    /// exist (or an issuer another provider has).
    Skipped {
        /// The record's kind.
        kind: AccessKind,
        /// Its name.
        name: String,
        /// The declaring file whose content is ignored.
        file: String,
        /// Why, naming the file or the field.
        reason: String,
    },
    /// A file-owned record no valid file declares, kept because its own file
    /// is present but invalid, or because a policy is still named by keys or
    /// providers that stay.
    Kept {
        /// The record's kind.
        kind: AccessKind,
        /// Its name.
        name: String,
        /// The file that owns it.
        file: String,
        /// Why.
        reason: String,
    },
}

impl AccessAction {
    /// The kind of the record this action concerns.
    pub fn kind(&self) -> AccessKind {
        match self {
            AccessAction::Create { spec, .. } => spec.kind(),
            AccessAction::Update { current, .. } | AccessAction::Delete { current, .. } => {
                current.spec.kind()
            }
            AccessAction::Unchanged { kind, .. }
            | AccessAction::Skipped { kind, .. }
            | AccessAction::Kept { kind, .. } => *kind,
        }
    }

    /// The name of the record this action concerns.
    pub fn name(&self) -> &str {
        match self {
            AccessAction::Create { spec, .. } => spec.name(),
            AccessAction::Update { current, .. } | AccessAction::Delete { current, .. } => {
                current.spec.name()
            }
            AccessAction::Unchanged { name, .. }
            | AccessAction::Skipped { name, .. }
            | AccessAction::Kept { name, .. } => name,
        }
    }

    /// When [`apply`] runs it: provider deletes, then policy writes, then
    /// provider writes, then policy deletes, so that a provider's rules
    /// never name a policy that is not there yet or no longer there.
    fn phase(&self) -> u8 {
        match (self, self.kind()) {
            (AccessAction::Delete { .. }, AccessKind::Policy) => 3,
            (AccessAction::Delete { .. }, _) => 0,
            (_, AccessKind::Policy) => 1,
            _ => 2,
        }
    }
}

/// The changes a `policies.d` scan implies for the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyPlan {
    /// Store revision the plan was computed against.
    pub revision: u64,
    /// One action per record concerned, ordered by kind (policies first)
    /// then name. Records owned by admin or api that no file declares have
    /// none.
    pub actions: Vec<AccessAction>,
}

impl PolicyPlan {
    /// Whether applying the plan writes anything.
    pub fn has_changes(&self) -> bool {
        self.actions.iter().any(|a| {
            matches!(
                a,
                AccessAction::Create { .. }
                    | AccessAction::Update { .. }
                    | AccessAction::Delete { .. }
            )
        })
    }

    /// A human-readable diff against the store, for `--dry-run`, in the form
    /// of the `mcp.d` plan's ([`crate::Plan::render`]); records show as
    /// they would be written in a file.
    pub fn render(&self) -> String {
        let mut out = Render::default();
        for action in &self.actions {
            let what = describe(action.kind(), action.name());
            match action {
                AccessAction::Create { file, spec } => out.create(&what, file, &file_form(spec)),
                AccessAction::Update {
                    file,
                    current,
                    spec,
                } => out.update(
                    &what,
                    file,
                    (&current.source, current.revision),
                    &file_form(&current.spec),
                    &file_form(spec),
                ),
                AccessAction::Delete { current, reason } => {
                    out.delete(&what, reason, &file_form(&current.spec));
                }
                AccessAction::Unchanged { file, .. } => out.unchanged(&what, file),
                AccessAction::Skipped { file, reason, .. } => out.skipped(&what, file, reason),
                AccessAction::Kept { file, reason, .. } => out.kept(&what, file, reason),
            }
        }
        out.finish(self.revision)
    }
}

/// A record as a `policies.d` file holds it.
#[derive(Serialize)]
struct FileForm<'a> {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    policies: BTreeMap<&'a str, &'a TaskPolicy>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    identity_providers: &'a [IdentityProviderRecord],
}

fn file_form(spec: &AccessSpec) -> String {
    let form = match spec {
        AccessSpec::Policy(record) => FileForm {
            policies: BTreeMap::from([(record.name.as_str(), &record.policy)]),
            identity_providers: &[],
        },
        AccessSpec::IdentityProvider(provider) => FileForm {
            policies: BTreeMap::new(),
            identity_providers: std::slice::from_ref(provider),
        },
        // Never planned (FILE_KINDS); named rather than shown.
        AccessSpec::ApiKey(key) => return format!("# api key {}\n", key.id),
    };
    // Plain strings, numbers, lists and tables: cannot fail.
    toml::to_string_pretty(&form).unwrap_or_else(|err| format!("# unrenderable record: {err}\n"))
}

/// Compares what `scan` declares with the store: the ownership rules of
/// `mcp.d` (crate docs) per kind and name, then the references the store
/// would refuse: a provider whose rule names a policy that will not exist,
/// or whose issuer another provider keeps, is skipped; a policy to delete
/// that keys or remaining providers still name is kept. Reads only.
pub async fn plan(store: &dyn Store, scan: &PolicyScan) -> Result<PolicyPlan, BootstrapError> {
    let snapshot = store.list().await?;
    let stored: BTreeMap<(AccessKind, &str), &StoredAccess> = snapshot
        .access
        .iter()
        .filter(|r| FILE_KINDS.contains(&r.spec.kind()))
        .map(|r| ((r.spec.kind(), r.spec.name()), r))
        .collect();
    let declared: BTreeMap<(AccessKind, &str), &AccessFileRecord> = scan
        .records
        .iter()
        .map(|r| ((r.spec.kind(), r.spec.name()), r))
        .collect();
    let keys: BTreeSet<(AccessKind, &str)> =
        stored.keys().chain(declared.keys()).copied().collect();

    let mut actions = Vec::new();
    for (kind, name) in keys {
        let record = declared.get(&(kind, name)).copied();
        let current = stored.get(&(kind, name)).copied();
        let decision = decide(
            &describe(kind, name),
            record.map(|r| r.file.as_str()),
            current.map(|c| (&c.source, record.is_some_and(|r| r.spec == c.spec))),
            scan,
            // A name is defined by one file only (a second file is invalid),
            // so an invalid owner keeps its records whatever the order.
            |_, _| true,
        );
        let (kind, name) = (kind, name.to_owned());
        let action = match (decision, record, current) {
            (Decision::Create, Some(record), _) => AccessAction::Create {
                file: record.file.clone(),
                spec: record.spec.clone(),
            },
            (Decision::Update, Some(record), Some(current)) => AccessAction::Update {
                file: record.file.clone(),
                current: Box::new(current.clone()),
                spec: record.spec.clone(),
            },
            (Decision::Unchanged, Some(record), _) => AccessAction::Unchanged {
                kind,
                name,
                file: record.file.clone(),
            },
            (Decision::Skipped(reason), Some(record), _) => AccessAction::Skipped {
                kind,
                name,
                file: record.file.clone(),
                reason,
            },
            (Decision::Delete(reason), _, Some(current)) => AccessAction::Delete {
                current: Box::new(current.clone()),
                reason,
            },
            (Decision::Kept(reason), _, Some(current)) => AccessAction::Kept {
                kind,
                name,
                file: current.source.file_name().unwrap_or_default().to_owned(),
                reason,
            },
            _ => continue,
        };
        actions.push(action);
    }
    check_references(&mut actions, &snapshot.access, &declared);
    Ok(PolicyPlan {
        revision: snapshot.revision,
        actions,
    })
}

/// Turns the writes the store would refuse into skips, and the policy
/// deletes it would refuse into keeps, judged against the records as they
/// will be once the plan is applied.
fn check_references(
    actions: &mut [AccessAction],
    stored: &[StoredAccess],
    declared: &BTreeMap<(AccessKind, &str), &AccessFileRecord>,
) {
    // The policies and providers after the plan.
    let mut policies: BTreeSet<String> = BTreeSet::new();
    let mut providers: BTreeMap<String, IdentityProviderRecord> = BTreeMap::new();
    let mut put = |spec: &AccessSpec| match spec {
        AccessSpec::Policy(policy) => {
            policies.insert(policy.name.clone());
        }
        AccessSpec::IdentityProvider(provider) => {
            providers.insert(provider.name.clone(), provider.clone());
        }
        AccessSpec::ApiKey(_) => {}
    };
    for record in stored {
        put(&record.spec);
    }
    for action in actions.iter() {
        if let AccessAction::Create { spec, .. } | AccessAction::Update { spec, .. } = action {
            put(spec);
        }
    }
    for action in actions.iter() {
        if let AccessAction::Delete { current, .. } = action {
            match &current.spec {
                AccessSpec::Policy(policy) => policies.remove(&policy.name),
                spec => providers.remove(spec.name()).is_some(),
            };
        }
    }

    // Providers first: one skipped keeps its stored version, whose rules
    // count when deciding whether a policy may go.
    for action in actions.iter_mut() {
        let (file, spec, current) = match action {
            AccessAction::Create { file, spec } => (file, spec, None),
            AccessAction::Update {
                file,
                current,
                spec,
            } => (file, spec, Some(current)),
            _ => continue,
        };
        let AccessSpec::IdentityProvider(provider) = spec else {
            continue;
        };
        let at = declared
            .get(&(AccessKind::IdentityProvider, provider.name.as_str()))
            .map_or("identity_providers[?]", |r| r.at.as_str());
        let Some(reason) = refusal(provider, at, &policies, &providers) else {
            continue;
        };
        match current.map(|c| &c.spec) {
            Some(AccessSpec::IdentityProvider(stored)) => {
                providers.insert(stored.name.clone(), stored.clone())
            }
            _ => providers.remove(&provider.name),
        };
        *action = AccessAction::Skipped {
            kind: AccessKind::IdentityProvider,
            name: provider.name.clone(),
            file: file.clone(),
            reason,
        };
    }

    for action in actions.iter_mut() {
        let AccessAction::Delete { current, .. } = action else {
            continue;
        };
        let AccessSpec::Policy(policy) = &current.spec else {
            continue;
        };
        let keys = stored
            .iter()
            .filter(|r| r.spec.kind() == AccessKind::ApiKey)
            .map(|r| &r.spec);
        let users: Vec<String> = keys
            .filter(|spec| spec.policies_named().contains(policy.name.as_str()))
            .map(|spec| format!("{}:{}", spec.kind(), spec.name()))
            .chain(
                providers
                    .values()
                    .filter(|p| {
                        p.rules
                            .iter()
                            .any(|r| r.policy.as_ref() == Some(&policy.name))
                    })
                    .map(|p| format!("{}:{}", AccessKind::IdentityProvider, p.name)),
            )
            .collect();
        if users.is_empty() {
            continue;
        }
        *action = AccessAction::Kept {
            kind: AccessKind::Policy,
            name: policy.name.clone(),
            file: current.source.file_name().unwrap_or_default().to_owned(),
            reason: format!(
                "still used by {}; kept until nothing names it",
                users.join(", ")
            ),
        };
    }
}

/// Why the store (or the registry, for issuers) would refuse `provider` at
/// `at` of its file, given the policies and providers after the plan.
fn refusal(
    provider: &IdentityProviderRecord,
    at: &str,
    policies: &BTreeSet<String>,
    providers: &BTreeMap<String, IdentityProviderRecord>,
) -> Option<String> {
    let missing = provider.rules.iter().enumerate().find_map(|(i, rule)| {
        let policy = rule.policy.as_ref()?;
        (!policies.contains(policy))
            .then(|| format!("{at}.rules[{i}].policy: no such policy {policy:?}"))
    });
    missing.or_else(|| {
        providers
            .values()
            .find(|other| other.name != provider.name && other.issuer == provider.issuer)
            .map(|other| {
                format!(
                    "{at}.issuer: identity provider {:?} has this issuer already",
                    other.name
                )
            })
    })
}

/// Writes `plan` as `actor`: provider deletes, policy writes, provider
/// writes, policy deletes (see [`AccessAction`]). Every write expects the
/// revision the plan saw, so a record changed since planning fails alone
/// (listed in [`ApplyReport::failed`] as `<kind> <name>`) while the other
/// actions still run.
pub async fn apply(
    store: &dyn Store,
    plan: &PolicyPlan,
    actor: &str,
) -> Result<ApplyReport, BootstrapError> {
    let mut report = ApplyReport::default();
    let mut ordered: Vec<&AccessAction> = plan.actions.iter().collect();
    ordered.sort_by_key(|action| action.phase());
    for action in ordered {
        let (kind, name) = (action.kind(), action.name());
        let result = match action {
            AccessAction::Create { file, spec } => {
                put(store, &mut report, actor, file, spec, 0).await
            }
            AccessAction::Update {
                file,
                current,
                spec,
            } => put(store, &mut report, actor, file, spec, current.revision).await,
            AccessAction::Delete { current, reason } => {
                let request = AccessDelete {
                    kind,
                    name: name.to_owned(),
                    expected_revision: Some(current.revision),
                    actor: actor.to_owned(),
                    source: current.source.clone(),
                };
                store.delete_access(request).await.map(|revision| {
                    report.deleted += 1;
                    tracing::info!(%kind, name, revision, reason = %reason, "deleted by policies.d rescan");
                })
            }
            AccessAction::Unchanged { .. } => {
                report.unchanged += 1;
                Ok(())
            }
            AccessAction::Skipped { file, reason, .. } => {
                report.skipped += 1;
                tracing::warn!(%kind, name, file = %file, reason = %reason, "policies.d declaration skipped");
                Ok(())
            }
            AccessAction::Kept { file, reason, .. } => {
                report.kept += 1;
                tracing::warn!(%kind, name, file = %file, reason = %reason, "policies.d record kept");
                Ok(())
            }
        };
        if let Err(err) = result {
            tracing::warn!(%kind, name, error = %err, "policies.d change not applied");
            report.failed.push((describe(kind, name), err.to_string()));
        }
    }
    Ok(report)
}

async fn put(
    store: &dyn Store,
    report: &mut ApplyReport,
    actor: &str,
    file: &str,
    spec: &AccessSpec,
    expected_revision: u64,
) -> Result<(), StoreError> {
    let request = AccessPut {
        spec: spec.clone(),
        expected_revision: Some(expected_revision),
        actor: actor.to_owned(),
        source: Source::File(file.to_owned()),
    };
    let outcome = store.put_access(request).await?;
    let (kind, name) = (spec.kind(), spec.name());
    match &outcome {
        AccessOutcome::Created(stored) => {
            report.created += 1;
            tracing::info!(%kind, name, file, revision = stored.revision, "created from policies.d");
        }
        AccessOutcome::Updated(stored) => {
            report.updated += 1;
            tracing::info!(%kind, name, file, revision = stored.revision, "updated from policies.d");
        }
        AccessOutcome::Unchanged(_) => report.unchanged += 1,
    }
    Ok(())
}
