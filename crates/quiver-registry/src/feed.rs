//! Change fan-out to watchers (R-WATCH-1…4).
//!
//! One pump task per registry process follows the store's head revision and
//! reads new change-log rows once, broadcasting them on a bounded ring. Each
//! watcher subscribes to the ring *before* replaying its backlog from the
//! change log, so nothing committed in between is missed; events it already
//! sent are skipped by revision. A watcher that falls behind the ring (it
//! stopped reading, or its client is slow) does not slow anyone down: the
//! ring overwrites, and the watcher catches up from the change log when it
//! resumes, or is told to resync if that part of the log was compacted.
//! Memory per watcher is bounded by its small outgoing channel.
//!
//! For each new upsert the pump also reads its history row (the full record
//! as of that revision, by key), and keeps the registry's in-memory head
//! ([`HeadView`]) with them before it broadcasts. So lists are
//! served from memory, and each event carries its record as of its revision:
//! a change costs this replica the same reads (its change-log row, an
//! upsert's history row) however many watchers follow it. The last
//! `ring_capacity` changes also stay in memory, so a watcher that fell
//! behind catches up without the database while it can.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use quiver_model::access::StoredAccess;
use quiver_model::{Change, ChangeKind, HistoryEntry, StoredServer};
use quiver_proto::v1 as pb;
use quiver_store::{AccessHistoryEntry, Head, HistoryPage, Store, StoreError};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::error::RegistryError;
use crate::head::{AccessMap, HeadView};

/// Changes read from the change log per query.
const PAGE: u32 = 512;
/// History rows of one page read at a time.
const RECORD_READS: usize = 4;
/// Outgoing events buffered per watcher before it is considered stalled.
pub const WATCHER_BUFFER: usize = 32;
/// How long a closing stream waits to deliver its final error.
const FINAL_SEND_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a head read answers the checks of the watches opened after it
/// ([`ChangeFeed::watch`]).
const HEAD_CHECK_TTL: Duration = Duration::from_secs(1);
/// How long a list waits for the in-memory head to reach the newest revision
/// this process knows committed before it reads the database instead.
const HEAD_WAIT: Duration = Duration::from_secs(2);

/// The change of one revision, with the record it left.
#[derive(Debug, Clone)]
pub struct FeedChange {
    /// The change.
    pub change: Change,
    /// The record exactly as of this revision, for upserts; `None` for
    /// deletes and for changes replayed from the change log beyond the
    /// in-memory cache (the watcher fetches those itself).
    pub server: Option<Arc<StoredServer>>,
    /// The access record exactly as of this revision, for access upserts
    /// (always known: a replay reads it).
    pub access: Option<Arc<StoredAccess>>,
    /// The watch event's wire encoding, unmasked and masked: made by the
    /// first stream that sends it, shared by every other.
    encoded: [OnceLock<Bytes>; 2],
}

// The encodings are a cache of the rest.
impl PartialEq for FeedChange {
    fn eq(&self, other: &Self) -> bool {
        (&self.change, &self.server, &self.access) == (&other.change, &other.server, &other.access)
    }
}

impl Eq for FeedChange {}

impl FeedChange {
    /// The change of one revision with what it left.
    pub fn new(
        change: Change,
        server: Option<Arc<StoredServer>>,
        access: Option<Arc<StoredAccess>>,
    ) -> Self {
        FeedChange {
            change,
            server,
            access,
            encoded: [OnceLock::new(), OnceLock::new()],
        }
    }

    /// This change's watch event as sent on the wire, `masked` or not:
    /// `encode` runs once per flavour however many streams send it.
    pub fn encoded(&self, masked: bool, encode: impl FnOnce(&Self) -> Bytes) -> Bytes {
        self.encoded[usize::from(masked)]
            .get_or_init(|| encode(self))
            .clone()
    }

    /// The watch event of this change, carrying its record when known.
    pub fn message(&self) -> pb::WatchMcpServersResponse {
        let mut message = pb::WatchMcpServersResponse::from(&self.change);
        if let Some(server) = &self.server {
            message.servers.push(server.as_ref().into());
        }
        if let Some(access) = &self.access {
            message.access_upserts.push(access.as_ref().into());
        }
        message
    }
}

/// The history row of one upsert: what the change left.
enum Entry {
    Server(Box<HistoryEntry>),
    Access(Box<AccessHistoryEntry>),
}

/// Reads the history row of an upsert (the record exactly as of its
/// revision); `None` for deletes.
async fn entry_of(store: &dyn Store, change: &Change) -> Result<Option<Entry>, StoreError> {
    if change.kind != ChangeKind::Upsert {
        return Ok(None);
    }
    if change.access.is_some() {
        return match store.access_at(change.revision).await? {
            Some(entry) if entry.spec.is_some() => Ok(Some(Entry::Access(Box::new(entry)))),
            _ => Err(StoreError::Corrupt(format!(
                "no access history row for revision {}",
                change.revision
            ))),
        };
    }
    let rows = store
        .history_page(HistoryPage::After {
            after: change.revision - 1,
            server_id: Some(&change.server_id),
            limit: 1,
        })
        .await?;
    match rows.into_iter().next() {
        Some(row) if row.entry.revision == change.revision => {
            Ok(Some(Entry::Server(Box::new(row.entry))))
        }
        _ => Err(StoreError::Corrupt(format!(
            "no history row for revision {} of {:?}",
            change.revision, change.server_id
        ))),
    }
}

/// What a watcher receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// The change of one revision.
    Change(Arc<FeedChange>),
    /// Keep-alive carrying the last revision delivered on this stream.
    Heartbeat(u64),
}

/// Tuning of the fan-out.
#[derive(Debug, Clone, Copy)]
pub struct FeedOptions {
    /// Heartbeat period of idle streams.
    pub heartbeat: Duration,
    /// Recent changes kept in memory for all watchers; a watcher further
    /// behind catches up from the change log instead.
    pub ring_capacity: usize,
}

impl Default for FeedOptions {
    fn default() -> Self {
        FeedOptions {
            heartbeat: Duration::from_secs(15),
            ring_capacity: 4096,
        }
    }
}

/// Handle to the fan-out; cheap to clone.
#[derive(Clone)]
pub struct ChangeFeed {
    ring: broadcast::Sender<Arc<FeedChange>>,
    recent: Arc<Mutex<Recent>>,
    head: watch::Receiver<Arc<HeadView>>,
    /// The newest revision this process knows committed (its own commits at
    /// once, other replicas' through the store's notifications).
    known: watch::Receiver<u64>,
    store: Arc<dyn Store>,
    /// The last head read for a watch's check, and when.
    checked_head: Arc<Mutex<Option<(Head, Instant)>>>,
    heartbeat: Duration,
    shutdown: CancellationToken,
}

impl ChangeFeed {
    /// Lists the store into the in-memory head and starts the pump; it stops
    /// when `shutdown` is cancelled.
    pub async fn start(
        store: Arc<dyn Store>,
        options: FeedOptions,
        shutdown: CancellationToken,
    ) -> Result<Self, RegistryError> {
        let capacity = options.ring_capacity.max(1);
        let (ring, _) = broadcast::channel(capacity);
        let known = store.subscribe();
        let listed = store.list().await?;
        let revision = listed.revision;
        let (head_tx, head) = watch::channel(Arc::new(HeadView::from_list(listed)));
        let recent = Arc::new(Mutex::new(Recent {
            changes: VecDeque::new(),
            tip: revision,
            capacity,
        }));
        let pump = Pump {
            store: store.clone(),
            ring: ring.clone(),
            head: head_tx,
            recent: recent.clone(),
            shutdown: shutdown.clone(),
        };
        metrics::gauge!("quiver_registry_revision").set(revision as f64);
        tokio::spawn(pump.run(revision));
        Ok(ChangeFeed {
            ring,
            recent,
            head,
            known,
            store,
            checked_head: Arc::default(),
            heartbeat: options.heartbeat,
            shutdown,
        })
    }

    /// Every record as of at least the database's head revision when asked
    /// (one single-row read), and never older than what this process knows
    /// committed: a client never lists an older revision than a write
    /// acknowledged by any replica before it asked, or than one it already
    /// saw here (a watch event). From memory; only if the pump does not get
    /// there within a bound is the list read from the database. With the
    /// database unreachable, memory serves what this process knows.
    pub async fn head(&self) -> Result<Arc<HeadView>, RegistryError> {
        let committed = self.store.head().await.map_or(0, |head| head.revision);
        let known = committed.max(*self.known.borrow());
        let current = self.head.borrow().clone();
        if current.revision >= known {
            return Ok(current);
        }
        let mut head = self.head.clone();
        let reached = tokio::time::timeout(HEAD_WAIT, async {
            head.wait_for(|view| view.revision >= known)
                .await
                .map(|view| view.clone())
        })
        .await;
        if let Ok(Ok(view)) = reached {
            return Ok(view);
        }
        metrics::counter!("quiver_registry_head_fallbacks_total").increment(1);
        tracing::warn!(
            known,
            head = current.revision,
            "the in-memory head is behind; listing from the database"
        );
        let listed = self.store.list().await?;
        Ok(Arc::new(HeadView::from_list(listed)))
    }

    /// The newest revision this process knows committed.
    pub fn known_revision(&self) -> u64 {
        *self.known.borrow()
    }

    /// The in-memory head as it is now (it may trail the database by the
    /// changes the pump has not read yet).
    pub fn current_head(&self) -> Arc<HeadView> {
        self.head.borrow().clone()
    }

    /// Opens a watch from `since_revision`: checks it against the change log,
    /// then streams replayed and live events into the returned receiver.
    pub async fn watch(
        &self,
        since_revision: u64,
    ) -> Result<mpsc::Receiver<Result<WatchEvent, RegistryError>>, RegistryError> {
        // Subscribe first: anything committed from now on is in the ring.
        let live = self.ring.subscribe();
        self.check_since(since_revision).await?;
        let (tx, rx) = mpsc::channel(WATCHER_BUFFER);
        let watcher = Watcher {
            store: self.store.clone(),
            recent: self.recent.clone(),
            live,
            tx,
            last: since_revision,
            heartbeat: self.heartbeat,
            shutdown: self.shutdown.clone(),
        };
        tokio::spawn(watcher.run());
        Ok(rx)
    }

    /// Refuses a watch from a revision the change log cannot serve. A head
    /// read less than [`HEAD_CHECK_TTL`] old answers for a revision within
    /// it, so the workers of a replica that died resume here at a read per
    /// second, not one each (issue #28). A compaction since that read is
    /// caught by the watcher, as one right after the check would be; a
    /// revision the read does not cover is checked with a fresh one.
    async fn check_since(&self, since_revision: u64) -> Result<(), RegistryError> {
        let recent = self
            .checked_head
            .lock()
            .ok()
            .and_then(|checked| *checked)
            .filter(|(_, at)| at.elapsed() < HEAD_CHECK_TTL)
            .map(|(head, _)| head);
        if recent
            .is_some_and(|head| (head.compaction_floor..=head.revision).contains(&since_revision))
        {
            return Ok(());
        }
        let head = self.store.head().await?;
        if let Ok(mut checked) = self.checked_head.lock() {
            *checked = Some((head, Instant::now()));
        }
        if since_revision < head.compaction_floor {
            return Err(RegistryError::FailedPrecondition(format!(
                "since_revision {since_revision} is below the compaction floor {}; list again and watch from its revision",
                head.compaction_floor
            )));
        }
        if since_revision > head.revision {
            return Err(RegistryError::FailedPrecondition(format!(
                "since_revision {since_revision} is ahead of head revision {}; list again and watch from its revision",
                head.revision
            )));
        }
        Ok(())
    }
}

/// Recent changes with their records, the last `capacity` revisions up to
/// `tip` (the pump's last revision), for watchers catching up.
struct Recent {
    changes: VecDeque<Arc<FeedChange>>,
    tip: u64,
    capacity: usize,
}

/// What the in-memory cache holds after a revision.
enum Cached {
    /// Nothing after it yet: the ring brings what follows.
    UpToDate,
    /// The changes after it (consecutive, at most a page).
    Changes(Vec<Arc<FeedChange>>),
    /// It is older than the cache: read the change log.
    Older,
}

impl Recent {
    fn push(&mut self, changes: &[Arc<FeedChange>], tip: u64) {
        self.changes.extend(changes.iter().cloned());
        while self.changes.len() > self.capacity {
            self.changes.pop_front();
        }
        self.tip = tip;
    }

    fn after(&self, last: u64) -> Cached {
        if last >= self.tip {
            return Cached::UpToDate;
        }
        match self.changes.front() {
            Some(first) if first.change.revision <= last + 1 => {
                let skip = usize::try_from(last + 1 - first.change.revision).unwrap_or(usize::MAX);
                Cached::Changes(
                    self.changes
                        .iter()
                        .skip(skip)
                        .take(PAGE as usize)
                        .cloned()
                        .collect(),
                )
            }
            _ => Cached::Older,
        }
    }
}

/// Follows the store's head: reads the history rows of new revisions once,
/// moves the in-memory head on, then broadcasts.
struct Pump {
    store: Arc<dyn Store>,
    ring: broadcast::Sender<Arc<FeedChange>>,
    head: watch::Sender<Arc<HeadView>>,
    recent: Arc<Mutex<Recent>>,
    shutdown: CancellationToken,
}

impl Pump {
    async fn run(self, mut last: u64) {
        let mut known = self.store.subscribe();
        loop {
            let target = *known.borrow_and_update();
            while last < target {
                let retry = match self.next_page(last).await {
                    Ok(None) => break,
                    Ok(Some(reached)) => {
                        last = reached;
                        false
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "reading new changes failed; retrying");
                        true
                    }
                };
                if retry {
                    tokio::select! {
                        () = self.shutdown.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_millis(250)) => {}
                    }
                }
            }
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                changed = known.changed() => if changed.is_err() { return },
            }
        }
    }

    /// Reads and applies the changes after `last` (a page); returns the
    /// revision reached, `None` when there was nothing new.
    async fn next_page(&self, last: u64) -> Result<Option<u64>, StoreError> {
        let page = self.store.changes_since(last, PAGE).await?;
        let Some(first) = page.first() else {
            return Ok(None);
        };
        if first.revision != last + 1 {
            // This pump fell behind the change log's compaction floor:
            // start over from a list. Watchers behind it are told to
            // resync when they find the gap (the change log is compacted).
            let listed = self.store.list().await?;
            tracing::warn!(
                after = last,
                listed = listed.revision,
                "the change feed fell behind the compacted change log; listed again"
            );
            self.head
                .send_replace(Arc::new(HeadView::from_list(listed)));
            if let Ok(mut recent) = self.recent.lock() {
                recent.changes.clear();
                recent.tip = self.head.borrow().revision;
            }
            return Ok(Some(self.head.borrow().revision));
        }
        // The record of each upsert exactly as of its revision: its history
        // row, found through the (server_id, revision) key.
        let mut entries: Vec<Option<Entry>> = Vec::with_capacity(page.len());
        for chunk in page.chunks(RECORD_READS) {
            entries.extend(
                futures::future::try_join_all(
                    chunk
                        .iter()
                        .map(|change| entry_of(self.store.as_ref(), change)),
                )
                .await?,
            );
        }
        Ok(Some(self.apply(page, entries)))
    }

    /// Applies consecutive changes to the head, publishes it, then the
    /// changes; returns the last revision.
    fn apply(&self, page: Vec<Change>, entries: Vec<Option<Entry>>) -> u64 {
        let current = self.head.borrow().clone();
        let mut servers: BTreeMap<String, Arc<StoredServer>> = current.servers.clone();
        let mut access: AccessMap = current.access.clone();
        let changes: Vec<Arc<FeedChange>> = page
            .into_iter()
            .zip(entries)
            .map(|(change, entry)| Arc::new(apply_change(&mut servers, &mut access, change, entry)))
            .collect();
        let last = changes
            .last()
            .map_or(current.revision, |c| c.change.revision);
        // The head first: a client that saw an event lists at least its revision.
        self.head
            .send_replace(Arc::new(HeadView::new(last, servers, access)));
        if let Ok(mut recent) = self.recent.lock() {
            recent.push(&changes, last);
        }
        for change in &changes {
            // No receivers is fine: nobody is watching.
            let _ = self.ring.send(change.clone());
        }
        metrics::gauge!("quiver_registry_revision").set(last as f64);
        last
    }
}

/// Applies one change to `servers` or `access`; an upsert's `entry` is its
/// history row, from which the record is rebuilt as a read returns it.
fn apply_change(
    servers: &mut BTreeMap<String, Arc<StoredServer>>,
    access: &mut AccessMap,
    change: Change,
    entry: Option<Entry>,
) -> FeedChange {
    if let Some(kind) = change.access {
        let key = (kind, change.server_id.clone());
        let record = match entry {
            Some(Entry::Access(entry)) => access_record(access.get(&key), &change, *entry),
            _ => None,
        };
        match &record {
            Some(record) => access.insert(key, record.clone()),
            None => access.remove(&key),
        };
        return FeedChange::new(change, None, record);
    }
    let entry = match entry {
        Some(Entry::Server(entry)) => Some(*entry),
        _ => None,
    };
    let server = match entry.and_then(|entry| entry.spec.map(|spec| (spec, entry.source))) {
        Some((spec, source)) => {
            // A record created again after a delete starts over.
            let created_at = servers
                .get(&change.server_id)
                .map_or(change.at, |held| held.created_at);
            let server = Arc::new(StoredServer {
                spec,
                revision: change.revision,
                created_at,
                updated_at: change.at,
                updated_by: change.actor.clone(),
                source,
            });
            servers.insert(change.server_id.clone(), server.clone());
            Some(server)
        }
        None => {
            servers.remove(&change.server_id);
            None
        }
    };
    FeedChange::new(change, server, None)
}

/// The access record an upsert left, as a read returns it.
fn access_record(
    held: Option<&Arc<StoredAccess>>,
    change: &Change,
    entry: AccessHistoryEntry,
) -> Option<Arc<StoredAccess>> {
    Some(Arc::new(StoredAccess {
        spec: entry.spec?,
        revision: change.revision,
        created_at: held.map_or(change.at, |held| held.created_at),
        updated_at: change.at,
        updated_by: change.actor.clone(),
        source: entry.source,
    }))
}

struct Watcher {
    store: Arc<dyn Store>,
    recent: Arc<Mutex<Recent>>,
    live: broadcast::Receiver<Arc<FeedChange>>,
    tx: mpsc::Sender<Result<WatchEvent, RegistryError>>,
    last: u64,
    heartbeat: Duration,
    shutdown: CancellationToken,
}

/// Why a watcher stopped.
enum Stop {
    /// The client went away.
    ClientGone,
    /// The stream ends with this error.
    Error(RegistryError),
}

impl Watcher {
    async fn run(mut self) {
        metrics::gauge!("quiver_registry_watchers").increment(1.0);
        let stop = self.serve().await;
        metrics::gauge!("quiver_registry_watchers").decrement(1.0);
        if let Stop::Error(err) = stop {
            // Best effort: the client may be gone or stalled; never hang on it.
            let _ = tokio::time::timeout(FINAL_SEND_TIMEOUT, self.tx.send(Err(err))).await;
        }
    }

    async fn serve(&mut self) -> Stop {
        if let Err(stop) = self.catch_up().await {
            return stop;
        }
        let mut heartbeat = tokio::time::interval(self.heartbeat);
        heartbeat.reset();
        loop {
            tokio::select! {
                () = self.shutdown.cancelled() => {
                    return Stop::Error(RegistryError::Unavailable("registry shutting down; reconnect".into()));
                }
                () = self.tx.closed() => return Stop::ClientGone,
                received = self.live.recv() => {
                    let result = match received {
                        Ok(change) if change.change.revision <= self.last => Ok(()),
                        Ok(change) if change.change.revision == self.last + 1 => self.send_change(change).await,
                        // A gap (compaction) or a lag: the change log knows the rest.
                        Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => self.catch_up().await,
                        Err(broadcast::error::RecvError::Closed) => Err(Stop::Error(
                            RegistryError::Unavailable("change feed stopped; reconnect".into()),
                        )),
                    };
                    if let Err(stop) = result {
                        return stop;
                    }
                }
                _ = heartbeat.tick() => {
                    if let Err(stop) = self.send(WatchEvent::Heartbeat(self.last)).await {
                        return stop;
                    }
                }
            }
        }
    }

    /// Sends every change after `last` up to the pump's: from memory while
    /// it holds them, else from the change log.
    async fn catch_up(&mut self) -> Result<(), Stop> {
        loop {
            let cached = match self.recent.lock() {
                Ok(recent) => recent.after(self.last),
                Err(_) => Cached::Older,
            };
            match cached {
                Cached::UpToDate => return Ok(()),
                Cached::Changes(changes) => {
                    for change in changes {
                        self.send_change(change).await?;
                    }
                    continue;
                }
                Cached::Older => {}
            }
            let page = self
                .store
                .changes_since(self.last, PAGE)
                .await
                .map_err(|err| Stop::Error(err.into()))?;
            let Some(first) = page.first() else {
                return Ok(());
            };
            if first.revision != self.last + 1 {
                return Err(Stop::Error(RegistryError::FailedPrecondition(format!(
                    "revisions after {} were compacted while this watcher was behind; list again and watch from its revision",
                    self.last
                ))));
            }
            for change in page {
                // Access records are always carried: a worker has no other
                // way to read one.
                let access = if change.access.is_some() {
                    match entry_of(self.store.as_ref(), &change).await {
                        Ok(Some(Entry::Access(entry))) => access_record(None, &change, *entry),
                        Ok(_) => None,
                        Err(err) => return Err(Stop::Error(err.into())),
                    }
                } else {
                    None
                };
                self.send_change(Arc::new(FeedChange::new(change, None, access)))
                    .await?;
            }
        }
    }

    async fn send_change(&mut self, change: Arc<FeedChange>) -> Result<(), Stop> {
        let revision = change.change.revision;
        self.send(WatchEvent::Change(change)).await?;
        self.last = revision;
        Ok(())
    }

    /// Waits for room in the outgoing buffer: a stalled client stalls only
    /// this task, and shutdown still ends it.
    async fn send(&self, event: WatchEvent) -> Result<(), Stop> {
        tokio::select! {
            sent = self.tx.send(Ok(event)) => sent.map_err(|_| Stop::ClientGone),
            () = self.shutdown.cancelled() => Err(Stop::Error(RegistryError::Unavailable(
                "registry shutting down; reconnect".into(),
            ))),
        }
    }
}
