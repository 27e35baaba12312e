//! Images of tool results for vision models (`mcp.vision`, docs/reference.md
//! §13.2). OpenAI's chat API takes only text in `role=tool` messages, so the
//! images of one call go in a `role=user` message after the turn's tool
//! messages: `[{"type": "text", "text": "image from tool call <id>"},
//! {"type": "image_url", "image_url": {"url": …}}, …]`, the URL a `data:`
//! URL or the artifact's signed URL on this worker (`[artifacts]
//! vision_url`). Only png, jpeg, gif and webp images are sent; other
//! artifacts (audio, svg, …) are a text part naming them. The tool message
//! itself keeps the note naming each artifact.

use serde_json::{Value, json};

use crate::artifacts::{Artifact, ArtifactStore, VisionUrl};
use crate::auth::CallerId;

/// The `role=user` message carrying the artifacts of tool call `call_id`,
/// or `None` when it produced none.
pub fn message(
    store: &ArtifactStore,
    owner: Option<CallerId>,
    call_id: &str,
    artifacts: &[Artifact],
) -> Option<Value> {
    if artifacts.is_empty() {
        return None;
    }
    let mut parts =
        vec![json!({"type": "text", "text": format!("image from tool call {call_id}")})];
    for artifact in artifacts {
        if !artifact.is_vision_image() {
            parts.push(json!({"type": "text", "text": format!(
                "artifact {} ({}, {} bytes) is not shown: only png, jpeg, gif and webp images are sent to the model",
                artifact.id, artifact.mime_type, artifact.bytes.len()
            )}));
            continue;
        }
        let options = store.options();
        let url = match (options.vision_url, owner.clone(), &options.public_url) {
            (VisionUrl::Artifact, Some(owner), Some(base)) => {
                store.signed_url(base, owner, artifact)
            }
            _ => artifact.data_url(),
        };
        parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
    }
    Some(json!({"role": "user", "content": parts}))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::artifacts::ArtifactOptions;

    #[test]
    fn images_as_data_urls_or_signed_urls_and_other_types_as_notes() {
        let store = ArtifactStore::default();
        let owner = CallerId::ANONYMOUS;
        let png = store
            .put(owner.clone(), "image/png", Bytes::from_static(b"png"))
            .unwrap();
        let wav = store
            .put(owner.clone(), "audio/wav", Bytes::from_static(b"wav"))
            .unwrap();
        assert_eq!(message(&store, Some(owner.clone()), "c1", &[]), None);
        let message = message(&store, Some(owner.clone()), "c1", &[png, wav]).unwrap();
        assert_eq!(message["role"], "user");
        let parts = message["content"].as_array().unwrap();
        assert_eq!(parts[0]["text"], "image from tool call c1");
        assert_eq!(parts[1]["type"], "image_url");
        assert_eq!(parts[1]["image_url"]["url"], "data:image/png;base64,cG5n");
        assert!(parts[2]["text"].as_str().unwrap().contains("audio/wav"));

        let store = ArtifactStore::new(ArtifactOptions {
            vision_url: VisionUrl::Artifact,
            public_url: Some("https://w.example".into()),
            ..Default::default()
        });
        let png = store
            .put(owner.clone(), "image/png", Bytes::from_static(b"png"))
            .unwrap();
        let message = super::message(
            &store,
            Some(owner.clone()),
            "c1",
            std::slice::from_ref(&png),
        )
        .unwrap();
        let url = message["content"][1]["image_url"]["url"].as_str().unwrap();
        assert!(
            url.starts_with(&format!(
                "https://w.example/v1/artifacts/{}?caller=",
                png.id
            )),
            "{url}"
        );
    }
}
