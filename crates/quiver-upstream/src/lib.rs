//! Client for an OpenAI-compatible chat completions endpoint, as the worker
//! uses it: request bodies are passed as bytes (the worker decides what they
//! contain), failures are classified for retries (R-CHAT-6), and streamed
//! answers come back as parsed chunks.

mod client;
mod error;
mod retry;

pub use client::{ChunkStream, Upstream, UpstreamConfigError, UpstreamOptions};
pub use error::UpstreamError;
