//! What a server says about itself: its log notifications
//! (`notifications/message`) kept in a bounded tail and counted in
//! `mcp_server_log_messages_total{server_id,level}`, never one worker log
//! line each (a server may send them in a loop), and the log rate limit of
//! its other events (`PeerEvents`).
#![expect(
    deprecated,
    reason = "SEP-2577 deprecates server logging, but servers still send it (and flood with it)"
)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};

use crate::peer_events::PeerEvents;

/// Log messages kept per server.
pub const SERVER_LOG_LINES: usize = 50;
/// Longest log message kept (longer ones are cut).
const LINE_MAX: usize = 1024;

/// One server's log tail and event rate limit, across restarts; cheap to clone.
#[derive(Debug, Clone)]
pub struct ServerLog {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    server_id: String,
    lines: Mutex<VecDeque<String>>,
    events: PeerEvents,
}

impl ServerLog {
    /// An empty log of `server_id`.
    pub fn new(server_id: &str) -> Self {
        ServerLog {
            inner: Arc::new(Inner {
                server_id: server_id.to_owned(),
                lines: Mutex::new(VecDeque::with_capacity(SERVER_LOG_LINES)),
                events: PeerEvents::default(),
            }),
        }
    }

    /// The server.
    pub fn server_id(&self) -> &str {
        &self.inner.server_id
    }

    /// The log rate limit of this server's events.
    pub fn events(&self) -> &PeerEvents {
        &self.inner.events
    }

    /// Takes one `notifications/message`: counted, kept in the tail, and
    /// logged at debug within the rate limit.
    pub fn record(&self, message: &LoggingMessageNotificationParam) {
        let level = level_name(message.level);
        metrics::counter!(
            "mcp_server_log_messages_total",
            "server_id" => self.inner.server_id.clone(),
            "level" => level
        )
        .increment(1);
        let text = match &message.data {
            serde_json::Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        let line = match &message.logger {
            Some(logger) => format!("{level} {logger}: {text}"),
            None => format!("{level}: {text}"),
        };
        let line = crate::output::truncate_utf8(&line, LINE_MAX).to_owned();
        if let Some(suppressed) = self.inner.events.admit("log_message") {
            tracing::debug!(
                server_id = %self.inner.server_id,
                suppressed,
                line = %line,
                "mcp server log message"
            );
        }
        let mut lines = self.inner.lines.lock().unwrap_or_else(|p| p.into_inner());
        if lines.len() == SERVER_LOG_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    /// The kept messages, oldest first (`"<level> <logger>: <data>"`).
    pub fn lines(&self) -> Vec<String> {
        self.inner
            .lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

/// The MCP name of a log level (the metric's `level` label).
fn level_name(level: LoggingLevel) -> &'static str {
    match level {
        LoggingLevel::Debug => "debug",
        LoggingLevel::Info => "info",
        LoggingLevel::Notice => "notice",
        LoggingLevel::Warning => "warning",
        LoggingLevel::Error => "error",
        LoggingLevel::Critical => "critical",
        LoggingLevel::Alert => "alert",
        LoggingLevel::Emergency => "emergency",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_is_bounded_in_lines_and_bytes() {
        let log = ServerLog::new("s");
        for i in 0..1000 {
            let mut message = LoggingMessageNotificationParam::new(
                LoggingLevel::Warning,
                serde_json::Value::String(format!("{i} {}", "x".repeat(10_000))),
            );
            message.logger = Some("app".into());
            log.record(&message);
        }
        let lines = log.lines();
        assert_eq!(lines.len(), SERVER_LOG_LINES);
        assert!(lines.iter().all(|line| line.len() <= LINE_MAX));
        assert!(lines[SERVER_LOG_LINES - 1].starts_with("warning app: 999 "));
    }
}
