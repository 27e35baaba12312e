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

use std::sync::Arc;
use std::time::Duration;

use quiver_model::Change;
use quiver_store::Store;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::error::RegistryError;

/// Changes read from the change log per query.
const PAGE: u32 = 512;
/// Outgoing events buffered per watcher before it is considered stalled.
pub const WATCHER_BUFFER: usize = 32;
/// How long a closing stream waits to deliver its final error.
const FINAL_SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// What a watcher receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// The change of one revision.
    Change(Arc<Change>),
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
    ring: broadcast::Sender<Arc<Change>>,
    store: Arc<dyn Store>,
    heartbeat: Duration,
    shutdown: CancellationToken,
}

impl ChangeFeed {
    /// Starts the pump; it stops when `shutdown` is cancelled.
    pub async fn start(
        store: Arc<dyn Store>,
        options: FeedOptions,
        shutdown: CancellationToken,
    ) -> Result<Self, RegistryError> {
        let (ring, _) = broadcast::channel(options.ring_capacity.max(1));
        let start = store.head().await?.revision;
        tokio::spawn(pump(store.clone(), ring.clone(), start, shutdown.clone()));
        Ok(ChangeFeed {
            ring,
            store,
            heartbeat: options.heartbeat,
            shutdown,
        })
    }

    /// Opens a watch from `since_revision`: checks it against the change log,
    /// then streams replayed and live events into the returned receiver.
    pub async fn watch(
        &self,
        since_revision: u64,
    ) -> Result<mpsc::Receiver<Result<WatchEvent, RegistryError>>, RegistryError> {
        // Subscribe first: anything committed from now on is in the ring.
        let live = self.ring.subscribe();
        let head = self.store.head().await?;
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
        let (tx, rx) = mpsc::channel(WATCHER_BUFFER);
        let watcher = Watcher {
            store: self.store.clone(),
            live,
            tx,
            last: since_revision,
            heartbeat: self.heartbeat,
            shutdown: self.shutdown.clone(),
        };
        tokio::spawn(watcher.run());
        Ok(rx)
    }
}

async fn pump(
    store: Arc<dyn Store>,
    ring: broadcast::Sender<Arc<Change>>,
    mut last: u64,
    shutdown: CancellationToken,
) {
    let mut head = store.subscribe();
    loop {
        let target = *head.borrow_and_update();
        while last < target {
            match store.changes_since(last, PAGE).await {
                Ok(page) if page.is_empty() => break,
                Ok(page) => {
                    for change in page {
                        last = change.revision;
                        // No receivers is fine: nobody is watching.
                        let _ = ring.send(Arc::new(change));
                    }
                    metrics::gauge!("quiver_registry_revision").set(last as f64);
                }
                Err(err) => {
                    tracing::warn!(error = %err, "reading the change log failed; retrying");
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_millis(250)) => {}
                    }
                }
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = head.changed() => if changed.is_err() { return },
        }
    }
}

struct Watcher {
    store: Arc<dyn Store>,
    live: broadcast::Receiver<Arc<Change>>,
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
                        Ok(change) if change.revision <= self.last => Ok(()),
                        Ok(change) if change.revision == self.last + 1 => self.send_change(change).await,
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

    /// Sends every change after `last` that the change log holds.
    async fn catch_up(&mut self) -> Result<(), Stop> {
        loop {
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
                self.send_change(Arc::new(change)).await?;
            }
        }
    }

    async fn send_change(&mut self, change: Arc<Change>) -> Result<(), Stop> {
        let revision = change.revision;
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
