"""The official OpenAI Python SDK as a caller of the worker's chat API.

Driven by tests/e2e/openai_sdk.rs (run with the venv python that
scripts/test.sh prepares). Makes, with MCP tools enabled through the `mcp`
extension object:

  (a) a non-streaming `client.chat.completions.create(...)`;
  (b) the same with `stream=True, stream_options={"include_usage": True}`,
      iterating the chunks as the SDK yields them.

Prints ONE JSON object on stdout describing what the SDK returned; each part
carries the exception it raised (as a string) instead of failing the whole
script, so the Rust test can say which part broke.

Usage: openai_sdk.py BASE_URL API_KEY MODEL SERVER_ID [PROMPT...]
(each argument falls back to QUIVER_SDK_BASE_URL, QUIVER_SDK_API_KEY,
QUIVER_SDK_MODEL, QUIVER_SDK_SERVER_ID, QUIVER_SDK_PROMPT).
"""

import json
import os
import sys
import traceback

import openai


def arg(index, env):
    if len(sys.argv) > index:
        return sys.argv[index]
    value = os.environ.get(env)
    if not value:
        sys.exit(f"usage: {sys.argv[0]} BASE_URL API_KEY MODEL SERVER_ID (or set {env})")
    return value


def error_text(err):
    """The exception as one string, with the HTTP answer when there is one."""
    text = f"{type(err).__name__}: {err}"
    response = getattr(err, "response", None)
    if response is not None:
        try:
            text += f" [HTTP {response.status_code}: {response.text}]"
        except Exception:  # a streamed body may be unreadable by now
            text += f" [HTTP {response.status_code}]"
    return text + "\n" + "".join(traceback.format_tb(err.__traceback__))


def usage_dict(usage):
    if usage is None:
        return None
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def non_streaming(client, model, messages, extension):
    result = {"error": None}
    try:
        completion = client.chat.completions.create(
            model=model, messages=messages, extra_body={"mcp": extension}
        )
        choice = completion.choices[0]
        extra = completion.model_extra or {}
        result.update(
            {
                "object": completion.object,
                "choices": len(completion.choices),
                "role": choice.message.role,
                "content": choice.message.content,
                "tool_calls": [call.to_dict() for call in choice.message.tool_calls or []],
                "finish_reason": choice.finish_reason,
                "usage": usage_dict(completion.usage),
                # Unknown top-level fields as the SDK keeps them.
                "mcp": extra.get("mcp"),
                "mcp_in_to_dict": completion.to_dict().get("mcp"),
            }
        )
    except Exception as err:
        result["error"] = error_text(err)
    return result


def streaming(client, model, messages, extension):
    result = {
        "error": None,
        "chunks": 0,
        "content": "",
        "roles": [],
        "objects": [],
        "finish_reasons": [],
        "tool_call_deltas": 0,
        "usage": None,
        "usage_chunks": 0,
        "mcp": None,
        "mcp_chunks": [],
        "mcp_chunk_has_finish_reason": None,
    }
    try:
        stream = client.chat.completions.create(
            model=model,
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"mcp": extension},
        )
        for index, chunk in enumerate(stream):
            result["chunks"] += 1
            if chunk.object not in result["objects"]:
                result["objects"].append(chunk.object)
            finished = False
            for choice in chunk.choices:
                delta = choice.delta
                if delta.role and delta.role not in result["roles"]:
                    result["roles"].append(delta.role)
                if delta.content:
                    result["content"] += delta.content
                if delta.tool_calls:
                    result["tool_call_deltas"] += len(delta.tool_calls)
                if choice.finish_reason is not None:
                    finished = True
                    result["finish_reasons"].append(choice.finish_reason)
            if chunk.usage is not None:
                result["usage_chunks"] += 1
                result["usage"] = usage_dict(chunk.usage)
            mcp = (chunk.model_extra or {}).get("mcp")
            if mcp is not None:
                result["mcp_chunks"].append(index)
                result["mcp"] = mcp
                result["mcp_chunk_has_finish_reason"] = finished
    except Exception as err:
        result["error"] = error_text(err)
    return result


def main():
    base_url = arg(1, "QUIVER_SDK_BASE_URL")
    api_key = arg(2, "QUIVER_SDK_API_KEY")
    model = arg(3, "QUIVER_SDK_MODEL")
    server_id = arg(4, "QUIVER_SDK_SERVER_ID")
    prompt = " ".join(sys.argv[5:]) or os.environ.get(
        "QUIVER_SDK_PROMPT", "Echo 'hello from the sdk', then tell me what it said."
    )

    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=30.0)
    messages = [{"role": "user", "content": prompt}]
    extension = {"enabled": True, "server_ids": [server_id]}
    report = {
        "sdk_version": openai.__version__,
        "non_streaming": non_streaming(client, model, messages, extension),
        "streaming": streaming(client, model, messages, extension),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
