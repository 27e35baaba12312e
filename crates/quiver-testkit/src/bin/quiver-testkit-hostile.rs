//! `quiver-testkit-hostile`: a stdio MCP server that misbehaves on purpose,
//! for the hostile-peer tests of issue #10. It speaks raw newline-delimited
//! JSON-RPC (no SDK), so it can send what an SDK never would: a listing that
//! never ends, answers larger than any client accepts, schemas nested deeper
//! than parsers allow, or no answer at all.
//!
//! It always answers `initialize` and `ping`, and lists an `echo` tool that
//! answers its `text` argument, unless `--mode` says otherwise for
//! `tools/list` or `tools/call`. Where an answer is huge, its `id` comes last,
//! after the payload, so a client has to read past the payload to find it.

use std::io::{BufRead as _, BufWriter, Write as _};

use clap::{Parser, ValueEnum};
use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Every `tools/list` page carries a `nextCursor`: the listing never ends.
    EndlessCursor,
    /// `tools/list` is never answered.
    SilentList,
    /// `tools/list` is answered with one message of `--bytes` bytes.
    HugeList,
    /// The listed tool's `inputSchema` is nested `--depth` levels deep.
    DeepSchema,
    /// `tools/call` is answered with one message of `--bytes` bytes.
    HugeCall,
    /// Before each `tools/call` answer, a notification of `--bytes` bytes.
    HugeNotification,
}

#[derive(Debug, Parser)]
#[command(about = "A misbehaving stdio MCP server for hostile-peer tests")]
struct Args {
    /// How to misbehave.
    #[arg(long, value_enum)]
    mode: Mode,
    /// Size of the huge message of `huge-list`, `huge-call` and `huge-notification`.
    #[arg(long, default_value_t = 24_000_000)]
    bytes: usize,
    /// Nesting depth of the schema of `deep-schema`.
    #[arg(long, default_value_t = 300)]
    depth: usize,
    /// Tools per page of `endless-cursor`.
    #[arg(long, default_value_t = 1)]
    page_size: usize,
}

fn echo_tool(name: &str) -> Value {
    json!({
        "name": name,
        "description": "answers its text argument",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
    })
}

/// A schema object nested `depth` JSON levels deep (the outer object counts).
fn deep_schema(depth: usize) -> String {
    let levels = depth.max(2);
    format!(
        "{{\"type\":\"object\",\"x\":{}{{}}{}",
        "{\"x\":".repeat(levels - 2),
        "}".repeat(levels - 1)
    )
}

/// A JSON-RPC answer whose `result` is `result_json` and whose `id` is the
/// last key, written as one line.
fn answer_id_last(out: &mut impl std::io::Write, id: &Value, result_json: &str) {
    let _ = writeln!(
        out,
        "{{\"jsonrpc\":\"2.0\",\"result\":{result_json},\"id\":{id}}}"
    );
}

/// A text of `bytes` bytes (ASCII, no escaping needed).
fn filler(bytes: usize) -> String {
    "x".repeat(bytes)
}

fn main() {
    let args = Args::parse();
    let stdin = std::io::stdin().lock();
    let mut out = BufWriter::new(std::io::stdout().lock());
    let mut page = 0_u64;
    for line in stdin.lines() {
        let Ok(line) = line else { return };
        let Ok(message) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let Some(id) = message.get("id").cloned() else {
            continue; // a notification
        };
        let method = message["method"].as_str().unwrap_or_default();
        match method {
            "initialize" => {
                let result = json!({
                    "protocolVersion": message["params"]["protocolVersion"].as_str().unwrap_or("2025-06-18"),
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "quiver-testkit-hostile", "version": "0"},
                });
                answer_id_last(&mut out, &id, &result.to_string());
            }
            "tools/list" => match args.mode {
                Mode::SilentList => {}
                Mode::EndlessCursor => {
                    page += 1;
                    let tools: Vec<Value> = (0..args.page_size)
                        .map(|i| echo_tool(&format!("tool_{page}_{i}")))
                        .collect();
                    let result = json!({"tools": tools, "nextCursor": format!("page-{page}")});
                    answer_id_last(&mut out, &id, &result.to_string());
                }
                Mode::HugeList => {
                    let mut tool = echo_tool("echo");
                    tool["description"] = Value::String(filler(args.bytes));
                    let result = json!({"tools": [tool]});
                    answer_id_last(&mut out, &id, &result.to_string());
                }
                Mode::DeepSchema => {
                    let result = format!(
                        "{{\"tools\":[{{\"name\":\"echo\",\"inputSchema\":{}}}]}}",
                        deep_schema(args.depth)
                    );
                    answer_id_last(&mut out, &id, &result);
                }
                Mode::HugeCall | Mode::HugeNotification => {
                    let result = json!({"tools": [echo_tool("echo")]});
                    answer_id_last(&mut out, &id, &result.to_string());
                }
            },
            "tools/call" => {
                let text = message["params"]["arguments"]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let text = match args.mode {
                    Mode::HugeCall => filler(args.bytes),
                    Mode::HugeNotification => {
                        let notification = json!({
                            "jsonrpc": "2.0",
                            "method": "notifications/message",
                            "params": {"level": "info", "data": filler(args.bytes)},
                        });
                        let _ = writeln!(out, "{notification}");
                        text
                    }
                    _ => text,
                };
                let result = json!({"content": [{"type": "text", "text": text}]});
                answer_id_last(&mut out, &id, &result.to_string());
            }
            "ping" => answer_id_last(&mut out, &id, "{}"),
            _ => {
                let error = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "method not found"}});
                let _ = writeln!(out, "{error}");
            }
        }
        if out.flush().is_err() {
            return;
        }
    }
}
