//! Ending everything a stdio server started.
//!
//! A server runs as the leader of its own process group, with a variable
//! ([`INSTANCE_VAR`]) in its environment whose value is unique to its
//! connection; what it starts inherits both. When the connection closes, the
//! worker ends, SIGTERM then SIGKILL after [`GRACE`]:
//!
//! - the process group (whatever stayed in it);
//! - every descendant of the server, found by parent links in `/proc` while
//!   the server still lives: this finds a child that called `setsid` (new
//!   session and group) as long as its parent chain leads to the server;
//! - every process whose environment (`/proc/<pid>/environ`, readable for the
//!   worker's own user) carries the connection's marker: this finds a
//!   `setsid` daemon even after its parent exited and it was reparented to
//!   init (a double fork), or after the server itself died.
//!
//! What can still escape: a process that at once leaves the group (setsid or
//! setpgid), starts over with an environment without the marker (exec with
//! a new environment, e.g. `env -i`) and is no longer below the server when
//! the worker looks (double fork, or the server exited first); one that runs
//! as another user (setuid programs) or made itself unreadable
//! (`PR_SET_DUMPABLE` 0); and a pid reused in the instant between the scan
//! and the signal. Containing those takes a cgroup or a PID namespace per
//! server, which need privileges the worker does not assume.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// Environment variable marking a stdio server and what it starts.
pub const INSTANCE_VAR: &str = "QUIVER_MCP_INSTANCE";

/// How long what is left of a server gets after SIGTERM before SIGKILL.
pub const GRACE: Duration = Duration::from_secs(1);

/// Rounds of scanning for processes forked while the previous ones were
/// being ended.
const ROUNDS: usize = 3;

/// A marker value no other connection (of this worker or an earlier one
/// with the same pid) has.
pub fn instance_marker() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!(
        "{}-{since_epoch}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// What `/proc/<pid>/stat` says about one process.
struct Stat {
    pid: i32,
    parent: i32,
    group: i32,
    zombie: bool,
}

fn stat(pid: i32) -> Option<Stat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid pgrp ...`; comm may hold spaces and parentheses.
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let zombie = fields.next()? == "Z";
    let parent = fields.next()?.parse().ok()?;
    let group = fields.next()?.parse().ok()?;
    Some(Stat {
        pid,
        parent,
        group,
        zombie,
    })
}

/// Every process in `/proc`.
fn processes() -> Vec<Stat> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|entry| stat(entry.ok()?.file_name().to_str()?.parse().ok()?))
        .collect()
}

/// Every process below `root` (not `root` itself).
pub fn descendants(root: u32) -> BTreeSet<i32> {
    let Ok(root) = i32::try_from(root) else {
        return BTreeSet::new();
    };
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for process in processes() {
        children
            .entry(process.parent)
            .or_default()
            .push(process.pid);
    }
    let mut found = BTreeSet::new();
    let mut queue = vec![root];
    while let Some(parent) = queue.pop() {
        for &child in children.get(&parent).into_iter().flatten() {
            if found.insert(child) {
                queue.push(child);
            }
        }
    }
    found
}

/// Every process whose environment carries `INSTANCE_VAR=marker`.
fn marked(marker: &str) -> BTreeSet<i32> {
    let needle = format!("{INSTANCE_VAR}={marker}");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return BTreeSet::new();
    };
    dir.filter_map(|entry| {
        let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
        // Fails for other users' processes: those are not ours to end.
        let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        environ
            .split(|&byte| byte == 0)
            .any(|var| var == needle.as_bytes())
            .then_some(pid)
    })
    .collect()
}

/// Ends a stdio server's remains: its group (`pgid`, the server's pid),
/// `known` (its descendants, collected while it lived) and whatever carries
/// `marker`.
pub async fn end(pgid: u32, marker: &str, known: BTreeSet<i32>) {
    let own = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
    let group = i32::try_from(pgid)
        .ok()
        .map(Pid::from_raw)
        .filter(|&group| killpg(group, None).is_ok());
    let mut targets = known;
    for round in 0..ROUNDS {
        targets.extend(marked(marker));
        targets.remove(&own);
        let alive: Vec<Pid> = targets
            .iter()
            .map(|&pid| Pid::from_raw(pid))
            .filter(|&pid| !gone(pid))
            .collect();
        // Later rounds look for processes forked while the group was ending.
        let group = group.filter(|_| round == 0);
        if group.is_none() && alive.is_empty() {
            return;
        }
        tracing::debug!(
            pgid,
            processes = alive.len(),
            round,
            "stdio server left processes behind; ending them"
        );
        terminate(group, &alive).await;
        targets.clear();
    }
}

/// SIGTERM to the group and `pids`, up to [`GRACE`] for all to go, then SIGKILL.
async fn terminate(group: Option<Pid>, pids: &[Pid]) {
    let signal_all = |signal: Signal| {
        if let Some(group) = group {
            let _ = killpg(group, signal);
        }
        for &pid in pids {
            let _ = kill(pid, signal);
        }
    };
    let all_gone = || group.is_none_or(group_gone) && pids.iter().all(|&pid| gone(pid));
    signal_all(Signal::SIGTERM);
    let deadline = Instant::now() + GRACE;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if all_gone() {
            return;
        }
    }
    signal_all(Signal::SIGKILL);
}

/// Whether `pid` has exited: no such process, or a zombie waiting to be
/// reaped.
fn gone(pid: Pid) -> bool {
    kill(pid, None) == Err(Errno::ESRCH) || stat(pid.as_raw()).is_none_or(|stat| stat.zombie)
}

/// Whether every process of `group` has exited (the leader, our child, may
/// wait as a zombie until the transport reaps it).
fn group_gone(group: Pid) -> bool {
    killpg(group, None) == Err(Errno::ESRCH)
        || processes()
            .iter()
            .all(|process| process.group != group.as_raw() || process.zombie)
}
