//! Server-sent events over any byte stream, with a bound on the size of one
//! event: `sse-stream` buffers an event without limit, so a peer that never
//! ends a line would otherwise grow the buffer until the process runs out of
//! memory.

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use sse_stream::SseStream;
pub use sse_stream::{Error, Sse};

/// Parsed events; a [`BodyError`] surfaces as [`Error::Body`].
pub type EventStream = BoxStream<'static, Result<Sse, Error>>;

/// Why an event stream ended early.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Reading the body failed.
    #[error("{0}")]
    Body(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// One event grew past the limit.
    #[error("sse event exceeds {max} bytes")]
    EventTooLarge {
        /// The limit.
        max: usize,
    },
}

/// Parses a response body into SSE events, failing the stream when one event grows past
/// `max_event_bytes` (sse-stream itself buffers without limit).
pub fn bounded_event_stream<E>(
    body: impl Stream<Item = Result<Bytes, E>> + Send + 'static,
    max_event_bytes: usize,
) -> EventStream
where
    E: std::error::Error + Send + Sync + 'static,
{
    let mut limiter = EventSizeLimiter::new(max_event_bytes);
    let body = body.map(move |chunk| {
        let chunk = chunk.map_err(|error| BodyError::Body(Box::new(error)))?;
        limiter.observe(&chunk)?;
        Ok::<_, BodyError>(chunk)
    });
    SseStream::from_bytes_stream(body).boxed()
}

/// Counts the bytes the parser retains for the event being read: the lines since the
/// last blank line, leaving out comments, which the parser discards.
#[derive(Debug)]
struct EventSizeLimiter {
    max: usize,
    event_bytes: usize,
    line_bytes: usize,
    line_is_comment: bool,
    after_cr: bool,
}

impl EventSizeLimiter {
    fn new(max: usize) -> Self {
        Self {
            max,
            event_bytes: 0,
            line_bytes: 0,
            line_is_comment: false,
            after_cr: false,
        }
    }

    fn observe(&mut self, chunk: &[u8]) -> Result<(), BodyError> {
        for &byte in chunk {
            // "\r\n" is one line end, not a line end followed by a blank line.
            if std::mem::take(&mut self.after_cr) && byte == b'\n' {
                continue;
            }
            match byte {
                b'\r' | b'\n' => {
                    self.after_cr = byte == b'\r';
                    if self.line_bytes == 0 {
                        self.event_bytes = 0;
                    } else if !self.line_is_comment {
                        self.event_bytes = self.event_bytes.saturating_add(self.line_bytes + 1);
                    }
                    self.line_bytes = 0;
                    self.line_is_comment = false;
                }
                _ => {
                    if self.line_bytes == 0 {
                        self.line_is_comment = byte == b':';
                    }
                    self.line_bytes = self.line_bytes.saturating_add(1);
                }
            }
            if self.event_bytes.saturating_add(self.line_bytes) > self.max {
                return Err(BodyError::EventTooLarge { max: self.max });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observe_all(max: usize, chunks: &[&[u8]]) -> Result<(), BodyError> {
        let mut limiter = EventSizeLimiter::new(max);
        chunks.iter().try_for_each(|chunk| limiter.observe(chunk))
    }

    #[test]
    fn limiter_resets_on_blank_lines_in_every_line_ending() {
        for separator in [&b"\n\n"[..], b"\r\n\r\n", b"\r\r"] {
            let mut stream = Vec::new();
            for _ in 0..100 {
                stream.extend_from_slice(b"data: 0123456789");
                stream.extend_from_slice(separator);
            }
            assert!(observe_all(32, &[&stream]).is_ok(), "{separator:?}");
            // The same bytes split at every position must give the same answer.
            let split: Vec<&[u8]> = stream.chunks(1).collect();
            assert!(observe_all(32, &split).is_ok(), "{separator:?}");
        }
    }

    #[test]
    fn limiter_refuses_an_oversized_event_and_ignores_comments() {
        let long = [b'x'; 64];
        assert!(matches!(
            observe_all(32, &[b"data: ", &long]),
            Err(BodyError::EventTooLarge { max: 32 })
        ));
        // Six 8-byte lines without a blank line between them form one 48-byte event.
        assert!(observe_all(32, &[&b"data: a\n".repeat(6)]).is_err());
        assert!(observe_all(32, &[&b":keep-alive\n".repeat(100)]).is_ok());
    }

    #[tokio::test]
    async fn parses_events_and_fails_on_an_oversized_one() {
        let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
            Ok(Bytes::from_static(b"data: one\n\nevent: x\ndata: t")),
            Ok(Bytes::from_static(b"wo\n\ndata: ")),
            Ok(Bytes::from(vec![b'y'; 64])),
        ];
        let mut events = bounded_event_stream(futures::stream::iter(chunks), 32);
        let first = events.next().await.unwrap().unwrap();
        assert_eq!(first.data.as_deref(), Some("one"));
        let second = events.next().await.unwrap().unwrap();
        assert_eq!(
            (second.event.as_deref(), second.data.as_deref()),
            (Some("x"), Some("two"))
        );
        let error = events.next().await.unwrap().unwrap_err();
        assert!(error.to_string().contains("exceeds 32 bytes"), "{error}");
    }
}
