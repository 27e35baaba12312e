//! The connection state machine without a server: the transitions a
//! failed or refused connect makes, and what calls are told meanwhile.
//! (Connections that open, crash, idle out and recycle are tested against
//! a real server in `tests/pool.rs`.)

use std::time::{Duration, Instant};

use super::*;

fn options(min_ms: u64) -> PoolOptions {
    PoolOptions {
        restart_backoff_min: Duration::from_millis(min_ms),
        restart_backoff_max: Duration::from_millis(min_ms * 4),
        ..PoolOptions::default()
    }
}

fn retrying(link: &Link) -> Option<bool> {
    match link.view().state {
        ConnectionState::Connecting { retrying } => Some(retrying),
        _ => None,
    }
}

#[test]
fn a_failed_connect_refuses_calls_until_its_delay_is_over_then_connects_again() {
    let link = Link::default();
    let cause = McpError::Unavailable("exited before initialize: broken".into());
    assert!(link.connecting().is_none(), "nothing to back off from yet");
    assert_eq!(retrying(&link), Some(false));
    assert_eq!(link.failed(cause.clone(), &options(60_000)), 1);
    let now = Instant::now();
    let Step::Refuse(refused) = link.next_step(now) else {
        panic!("a backed-off entry refuses at once");
    };
    assert!(
        refused.to_string().contains("restarting after failures")
            && refused.to_string().contains("broken"),
        "{refused}"
    );
    // Past the delay (at most the 240 s cap), the next caller connects.
    let later = now + Duration::from_secs(241);
    assert!(matches!(
        link.next_step(later),
        Step::Connect { dead: None }
    ));
    // The cause moves out of the state, to stay the entry's last error.
    assert_eq!(
        link.connecting().map(|e| e.to_string()),
        Some(cause.to_string())
    );
    assert_eq!(retrying(&link), Some(true), "down until a connect succeeds");
    assert_eq!(link.failed(cause, &options(60_000)), 2);
}

#[test]
fn an_egress_refusal_keeps_its_code_while_backing_off() {
    let link = Link::default();
    let denied = McpError::EgressDenied("host not in the egress allowlist".into());
    link.failed(denied.clone(), &options(60_000));
    let Step::Refuse(refused) = link.next_step(Instant::now()) else {
        panic!("backing off");
    };
    assert_eq!(refused.code(), denied.code());
    assert_eq!(refused.to_string(), denied.to_string());
}

#[test]
fn the_child_cap_is_no_failure_but_the_next_connect_is_a_retry() {
    let link = Link::default();
    assert!(link.at_child_cap(), "newly at the cap");
    assert!(!link.at_child_cap(), "still at the cap: said once");
    // No backoff: the next caller may connect at once.
    assert!(matches!(
        link.next_step(Instant::now()),
        Step::Connect { dead: None }
    ));
    assert!(link.connecting().is_none());
    assert_eq!(retrying(&link), Some(true));
}

#[test]
fn a_connect_that_a_caller_gave_up_on_is_started_again() {
    let link = Link::default();
    link.connecting();
    // The caller that set `Connecting` was dropped; whoever holds the
    // single flight next connects.
    assert!(matches!(
        link.next_step(Instant::now()),
        Step::Connect { dead: None }
    ));
    assert!(link.usable().is_none());
    assert!(link.close().is_none() && link.recycle().is_none());
}
