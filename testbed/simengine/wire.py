"""The requests and answers on the wire: prompts as tokens, output lengths, response bodies.

Shared by both dialects: the OpenAI-compatible APIs (``chat``, ``completions``) that SGLang and
vLLM both serve, and SGLang's own ``generate``. Words are tokens (the load generator writes
prompts as words), so lengths and shared prefixes are exact without a tokenizer.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import time
from collections.abc import Sequence
from typing import Any


def prompt_key(tokens: Sequence[str]) -> str:
    """A short digest of a prompt's tokens, to tell which request an engine took: the
    harness cannot pass an id through the router (sglang-router 0.3.2 drops ``rid`` from a
    chat request)."""
    return hashlib.sha1("\x00".join(tokens).encode()).hexdigest()[:16]


def prompt_tokens(body: dict[str, Any]) -> list[str]:
    """The prompt of a request as tokens: whitespace-separated words (1 word = 1 token).

    The load generator writes prompts as words, so lengths and shared prefixes are exact
    without a real tokenizer; ``input_ids`` are taken as given."""
    if isinstance(body.get("input_ids"), list):
        return [str(t) for t in body["input_ids"]]
    if "messages" in body:
        parts: list[str] = []
        for message in body.get("messages") or []:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(p.get("text", "") for p in content if isinstance(p, dict))
        return " ".join(parts).split()
    prompt = body.get("text", body.get("prompt", ""))
    if isinstance(prompt, list):
        prompt = " ".join(str(p) for p in prompt)
    return str(prompt).split()


def max_new_tokens(api: str, body: dict[str, Any]) -> int:
    """Output length requested; the simulation always generates exactly this many tokens."""
    if api == "generate":
        value = (body.get("sampling_params") or {}).get("max_new_tokens", 128)
    elif api == "chat":
        value = body.get("max_completion_tokens") or body.get("max_tokens") or 128
    else:
        value = body.get("max_tokens") or 16
    return max(int(value), 1)


#: a cohort that may become a metric's label value as it is (no quoting needed)
_COHORT = re.compile(r"[A-Za-z0-9_.:/-]{1,64}")


def cohort_of(body: dict[str, Any]) -> str:
    """The cohort a request names in its OpenAI ``metadata`` map (key ``cohort``), "" when
    none or unusable: a test bed's tag (testbed/loadgen.py), not an engine's field."""
    metadata = body.get("metadata")
    cohort = metadata.get("cohort") if isinstance(metadata, dict) else None
    return cohort if isinstance(cohort, str) and _COHORT.fullmatch(cohort) else ""


def token_text(index: int) -> str:
    """The text of output token ``index``: one word, so clients can count tokens."""
    return f"t{index} "


def finish_reason(api: str, done: bool, n: int) -> Any:
    if not done:
        return None
    return {"type": "length", "length": n} if api == "generate" else "length"


def stream_chunk(api: str, rid: str, model: str, index: int, n_total: int, meta: dict) -> dict:
    """One streamed chunk carrying output token ``index`` (0-based) of ``n_total``."""
    done = index == n_total - 1
    if api == "generate":
        text = "".join(token_text(i) for i in range(index + 1))  # SGLang streams cumulative text
        info = {**meta, "id": rid, "completion_tokens": index + 1,
                "finish_reason": finish_reason(api, done, n_total)}  # fmt: skip
        return {"text": text, "meta_info": info, "index": 0}
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason(api, done, n_total)}
    if api == "chat":
        delta: dict[str, Any] = {"content": token_text(index)}
        if index == 0:
            delta["role"] = "assistant"
        choice["delta"] = delta
        kind = "chat.completion.chunk"
    else:
        choice["text"] = token_text(index)
        kind = "text_completion"
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model,
            "choices": [choice]}  # fmt: skip


def full_response(api: str, rid: str, model: str, n: int, meta: dict) -> dict:
    """The non-streaming answer with ``n`` output tokens."""
    text = "".join(token_text(i) for i in range(n))
    if api == "generate":
        info = {
            **meta,
            "id": rid,
            "completion_tokens": n,
            "finish_reason": finish_reason(api, True, n),
        }
        return {"text": text, "meta_info": info}
    usage = {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": n,
             "total_tokens": meta["prompt_tokens"] + n,
             "prompt_tokens_details": {"cached_tokens": meta["cached_tokens"]}}  # fmt: skip
    if api == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "finish_reason": "length"}  # fmt: skip
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": "length"}
        kind = "text_completion"
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model,
            "choices": [choice], "usage": usage}  # fmt: skip


def sse(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
