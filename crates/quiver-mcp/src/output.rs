//! The output budget (`max_tool_output_bytes`, R-MCP-3): tool output beyond
//! the cap is cut at a character boundary and marked, so what reaches the
//! model is always valid UTF-8 and says that it was truncated.

use rmcp::model::{CallToolResult, ContentBlock};

/// How big a content item counts: text by its UTF-8 bytes, binary payloads by
/// their (base64) data, anything else by its JSON size.
fn size_of(content: &ContentBlock) -> usize {
    match content {
        ContentBlock::Text(text) => text.text.len(),
        ContentBlock::Image(image) => image.data.len(),
        ContentBlock::Audio(audio) => audio.data.len(),
        _ => serde_json::to_string(content).map_or(0, |json| json.len()),
    }
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
    /// Bytes the server produced.
    pub original: usize,
    /// Bytes kept.
    pub kept: usize,
}

impl OutputSize {
    /// Whether anything was cut.
    pub fn truncated(&self) -> bool {
        self.kept < self.original
    }
}

/// Applies the cap in place; returns the sizes. Text items are cut at a
/// character boundary, binary items that do not fit whole are dropped, and a
/// final text item records the truncation.
pub fn enforce_cap(result: &mut CallToolResult, max_bytes: usize) -> OutputSize {
    let original: usize = result.content.iter().map(size_of).sum();
    if original <= max_bytes {
        return OutputSize {
            original,
            kept: original,
        };
    }
    let mut budget = max_bytes;
    let mut kept_items = Vec::with_capacity(result.content.len());
    for content in std::mem::take(&mut result.content) {
        if budget == 0 {
            break;
        }
        let size = size_of(&content);
        if size <= budget {
            budget -= size;
            kept_items.push(content);
            continue;
        }
        if let ContentBlock::Text(text) = &content {
            let prefix = truncate_utf8(&text.text, budget);
            budget -= prefix.len();
            if !prefix.is_empty() {
                kept_items.push(ContentBlock::text(prefix.to_owned()));
            }
        }
        // Binary content is never cut in half: it would be corrupt.
    }
    let kept = max_bytes - budget;
    kept_items.push(ContentBlock::text(format!(
        "[quiver: output truncated to {kept} of {original} bytes (max_tool_output_bytes = {max_bytes})]"
    )));
    result.content = kept_items;
    OutputSize { original, kept }
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
    fn binary_items_are_dropped_whole() {
        let mut result = CallToolResult::success(vec![
            ContentBlock::text("abc"),
            ContentBlock::image("aGVsbG8gd29ybGQ=", "image/png"),
        ]);
        let size = enforce_cap(&mut result, 5);
        assert_eq!(size.kept, 3);
        assert_eq!(result.content.len(), 2);
        assert!(result.content[0].as_text().is_some());
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
