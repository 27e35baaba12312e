//! The output budget (`max_tool_output_bytes`): everything a tool result
//! carries is bounded by one accounting rule, so what reaches the caller or
//! the model is at most the cap, always valid UTF-8, and marked whenever
//! anything was cut.
//!
//! The parts are counted in order, each against what the earlier ones left:
//!
//! 1. `content` items, in order. A text item counts its UTF-8 bytes plus the
//!    JSON of its own `_meta` and annotations; when it does not fit, its
//!    text is cut at a character boundary (its `_meta` and annotations are
//!    dropped). Image and audio items count nothing and are always kept:
//!    their bytes are bounded by the worker's artifact limits instead
//!    (`[artifacts] max_item_bytes`, docs/reference.md §13.2). Every other
//!    item (resource, link) counts its JSON size and is kept whole or
//!    dropped: binary data cut in half would be corrupt. An `isError`
//!    result's message is its content, counted the same way.
//! 2. `structuredContent`: its JSON size; kept whole if it fits in what is
//!    left, else dropped (a cut JSON value would not be the server's).
//! 3. The result's `_meta`: the same as `structuredContent`.
//!
//! When anything was cut or dropped, a final text item (the worker's own
//! words, not counted) says what and how much. A JSON-RPC error answer's
//! message is server text too: [`cap_service_error`] cuts it to the cap.
//!
//! [`OutputSize::original`] is the size of every counted part as the
//! server sent it (what the `mcp_tool_call_output_bytes` metric records),
//! not what was kept.

use std::io;

use rmcp::ServiceError;
use rmcp::model::{CallToolResult, ContentBlock};
use serde::Serialize;

/// Bytes of `value` as compact JSON, counted without building the string.
pub(crate) fn json_len<T: Serialize + ?Sized>(value: &T) -> usize {
    struct Counter(usize);
    impl io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // The model types and JSON values serialize without failing; a value
    // that somehow did not would count as nothing and be kept as received.
    serde_json::to_writer(&mut counter, value).map_or(0, |()| counter.0)
}

/// How big a content item counts (see the module documentation).
fn size_of(content: &ContentBlock) -> usize {
    match content {
        ContentBlock::Text(text) => {
            text.text.len()
                + text.meta.as_ref().map_or(0, json_len)
                + text.annotations.as_ref().map_or(0, json_len)
        }
        _ if is_binary(content) => 0,
        _ => json_len(content),
    }
}

/// Whether `content` is an image or audio item: not counted against the
/// cap, never cut or dropped by it.
pub fn is_binary(content: &ContentBlock) -> bool {
    matches!(content, ContentBlock::Image(_) | ContentBlock::Audio(_))
}

/// The longest prefix of `text` of at most `max` bytes that ends on a
/// character boundary.
pub fn truncate_utf8(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// What the cap did to a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputSize {
    /// Bytes the server sent: content, structured content and `_meta`.
    pub original: usize,
    /// Bytes kept.
    pub kept: usize,
}

impl OutputSize {
    /// Whether anything was cut or dropped.
    pub fn truncated(&self) -> bool {
        self.kept < self.original
    }
}

/// Applies the cap in place (the rule of the module documentation);
/// returns the sizes.
pub fn enforce_cap(result: &mut CallToolResult, max_bytes: usize) -> OutputSize {
    let content: usize = result.content.iter().map(size_of).sum();
    let structured = result.structured_content.as_ref().map_or(0, json_len);
    let meta = result.meta.as_ref().map_or(0, json_len);
    let original = content + structured + meta;
    if original <= max_bytes {
        return OutputSize {
            original,
            kept: original,
        };
    }
    let mut budget = max_bytes;
    let mut dropped = Vec::new();
    if content > budget {
        result.content = cap_content(std::mem::take(&mut result.content), &mut budget);
    } else {
        budget -= content;
    }
    if result.structured_content.is_some() {
        if structured <= budget {
            budget -= structured;
        } else {
            result.structured_content = None;
            dropped.push("structuredContent");
        }
    }
    if result.meta.is_some() {
        if meta <= budget {
            budget -= meta;
        } else {
            result.meta = None;
            dropped.push("_meta");
        }
    }
    let kept = max_bytes - budget;
    let dropped = if dropped.is_empty() {
        String::new()
    } else {
        format!("; dropped: {}", dropped.join(", "))
    };
    result.content.push(ContentBlock::text(format!(
        "[quiver: output truncated to {kept} of {original} bytes (max_tool_output_bytes = {max_bytes}){dropped}]"
    )));
    OutputSize { original, kept }
}

/// The items that fit in `budget` (taken from it): text cut at a character
/// boundary, other items whole or not at all.
fn cap_content(items: Vec<ContentBlock>, budget: &mut usize) -> Vec<ContentBlock> {
    let mut kept = Vec::with_capacity(items.len());
    for item in items {
        if is_binary(&item) {
            kept.push(item);
            continue;
        }
        if *budget == 0 {
            continue;
        }
        let size = size_of(&item);
        if size <= *budget {
            *budget -= size;
            kept.push(item);
            continue;
        }
        if let ContentBlock::Text(text) = &item {
            let prefix = truncate_utf8(&text.text, *budget);
            *budget -= prefix.len();
            if !prefix.is_empty() {
                kept.push(ContentBlock::text(prefix.to_owned()));
            }
        }
        // Any other item is dropped whole.
    }
    kept
}

/// Applies the cap to the message of a JSON-RPC error answer, which is
/// server text like a result's. Its `data` is kept (no caller is shown it),
/// and so are the stdio transport's own errors about an answer it dropped,
/// which name the limit that dropped it. Other failures pass unchanged.
pub fn cap_service_error(err: ServiceError, max_bytes: usize) -> ServiceError {
    match err {
        ServiceError::McpError(mut error) if crate::dropped::dropped_answer(&error).is_none() => {
            let original = error.message.len();
            if original > max_bytes {
                let kept = truncate_utf8(&error.message, max_bytes);
                error.message = format!(
                    "{kept} [quiver: error message truncated to {} of {original} bytes (max_tool_output_bytes = {max_bytes})]",
                    kept.len()
                )
                .into();
            }
            ServiceError::McpError(error)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_of(result: &CallToolResult) -> Vec<String> {
        result
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect()
    }

    #[test]
    fn small_output_is_untouched() {
        let mut result = CallToolResult::success(vec![ContentBlock::text("héllo")]);
        let size = enforce_cap(&mut result, 100);
        assert!(!size.truncated());
        assert_eq!(text_of(&result), ["héllo"]);
    }

    #[test]
    fn cuts_at_char_boundaries_and_marks() {
        let mut result = CallToolResult::success(vec![ContentBlock::text("é".repeat(10))]);
        let size = enforce_cap(&mut result, 7);
        assert_eq!(
            size,
            OutputSize {
                original: 20,
                kept: 6
            }
        );
        let texts = text_of(&result);
        assert_eq!(texts[0], "ééé");
        assert!(texts[1].contains("truncated to 6 of 20 bytes"), "{texts:?}");
    }

    #[test]
    fn images_and_audio_do_not_count_and_are_kept_whole() {
        let mut result = CallToolResult::success(vec![
            ContentBlock::text("abc"),
            ContentBlock::image("aGVsbG8gd29ybGQ=".repeat(100), "image/png"),
            ContentBlock::audio("AAAA".repeat(100), "audio/wav"),
        ]);
        let size = enforce_cap(&mut result, 5);
        assert_eq!((size.original, size.kept), (3, 3));
        assert_eq!(result.content.len(), 3);

        // Over the cap: the text is cut, the binary items stay.
        let mut result = CallToolResult::success(vec![
            ContentBlock::text("abcdefgh"),
            ContentBlock::image("aGVsbG8gd29ybGQ=", "image/png"),
            ContentBlock::text("more text"),
        ]);
        let size = enforce_cap(&mut result, 5);
        assert_eq!((size.original, size.kept), (17, 5));
        let texts = text_of(&result);
        assert_eq!(texts[0], "abcde");
        assert!(result.content[1].as_image().is_some());
        assert!(texts[1].contains("truncated to 5 of 17"), "{texts:?}");
    }

    #[test]
    fn resources_are_dropped_whole() {
        let mut result = CallToolResult::success(vec![
            ContentBlock::text("abc"),
            ContentBlock::embedded_text("file:///x", "a resource text"),
        ]);
        let size = enforce_cap(&mut result, 5);
        assert_eq!(size.kept, 3);
        assert_eq!(result.content.len(), 2);
        assert!(result.content[1].as_text().is_some());
    }

    /// What an `mcp` 2.x server sends for a `str` result: the text twice.
    fn doubled(text: &str) -> CallToolResult {
        let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
        result.structured_content = Some(serde_json::json!({"result": text}));
        result
    }

    #[test]
    fn structured_content_counts_and_is_kept_whole_when_it_fits() {
        let mut result = doubled(&"x".repeat(400));
        let size = enforce_cap(&mut result, 1000);
        // 400 bytes of text, then {"result":"x…"}: 400 + 13.
        assert_eq!(
            size,
            OutputSize {
                original: 813,
                kept: 813
            }
        );
        assert!(result.structured_content.is_some());
        assert_eq!(result.content.len(), 1);
    }

    #[test]
    fn structured_content_that_does_not_fit_is_dropped_and_marked() {
        let mut result = doubled(&"x".repeat(100_000));
        let size = enforce_cap(&mut result, 1000);
        assert_eq!(
            size,
            OutputSize {
                original: 200_013,
                kept: 1000
            }
        );
        assert!(result.structured_content.is_none());
        let texts = text_of(&result);
        assert_eq!(texts[0].len(), 1000);
        assert!(
            texts[1].contains("truncated to 1000 of 200013 bytes")
                && texts[1].contains("dropped: structuredContent"),
            "{texts:?}"
        );

        // Whole text, no room for the copy: still marked.
        let mut result = doubled(&"x".repeat(600));
        let size = enforce_cap(&mut result, 1000);
        assert_eq!((size.kept, size.truncated()), (600, true));
        assert!(result.structured_content.is_none());
        assert_eq!(text_of(&result)[0].len(), 600);
    }

    #[test]
    fn meta_counts_and_is_dropped_when_over() {
        let mut result = CallToolResult::success(vec![ContentBlock::text("small")]);
        let mut meta = rmcp::model::MetaObject::new();
        meta.insert("pad".into(), serde_json::json!("m".repeat(5000)));
        result.meta = Some(meta.clone());
        let size = enforce_cap(&mut result, 1000);
        assert_eq!(size.original, 5 + 5000 + 10);
        assert_eq!(size.kept, 5);
        assert!(result.meta.is_none());
        assert_eq!(text_of(&result)[0], "small");
        assert!(text_of(&result)[1].contains("dropped: _meta"));

        // A text item's own `_meta` counts with it.
        let mut item = rmcp::model::TextContent::new("small");
        item.meta = Some(meta);
        let mut result = CallToolResult::success(vec![ContentBlock::Text(item)]);
        let size = enforce_cap(&mut result, 1000);
        assert_eq!((size.original, size.kept), (5 + 5000 + 10, 5));
        assert_eq!(text_of(&result)[0], "small");
    }

    #[test]
    fn error_messages_are_cut_at_a_character_boundary_and_name_the_limit() {
        let big = rmcp::model::ErrorData::new(
            rmcp::model::ErrorCode(-32000),
            "é".repeat(1000),
            Some(serde_json::json!({"pad": "d".repeat(10_000)})),
        );
        let ServiceError::McpError(error) = cap_service_error(ServiceError::McpError(big), 101)
        else {
            panic!("still a JSON-RPC error");
        };
        assert!(
            error.message.starts_with(&"é".repeat(50))
                && error
                    .message
                    .contains("truncated to 100 of 2000 bytes (max_tool_output_bytes = 101)"),
            "{}",
            error.message
        );
        assert!(error.message.len() < 200);

        let small =
            rmcp::model::ErrorData::new(rmcp::model::ErrorCode(-32000), "no such thing", None);
        let ServiceError::McpError(error) = cap_service_error(ServiceError::McpError(small), 101)
        else {
            panic!("still a JSON-RPC error");
        };
        assert_eq!(error.message, "no such thing");
    }

    #[test]
    fn truncate_utf8_never_splits_a_character() {
        let text = "a€b";
        for max in 0..=text.len() {
            let prefix = truncate_utf8(text, max);
            assert!(prefix.len() <= max);
            assert!(text.starts_with(prefix));
        }
    }
}
