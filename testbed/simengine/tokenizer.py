"""A word-level tokenizer for the router, written next to the model path an engine reports."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

# The router loads a tokenizer for every model_path a worker reports, from the Hugging Face
# hub unless model_path is a local directory with a tokenizer.json (observed with 0.3.2; its
# own --tokenizer-path does not stop the per-worker load). Words are our tokens, so a
# whitespace word-level tokenizer with one entry serves.
WORD_TOKENIZER = {
    "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
    "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
    "decoder": None, "model": {"type": "WordLevel", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"},
}  # fmt: skip


def write_word_tokenizer(directory: str | Path) -> Path:
    """Create ``directory/tokenizer.json`` (atomically; engines may race) and return its path."""
    path = Path(directory) / "tokenizer.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".tokenizer.{uuid.uuid4().hex}.json")
        tmp.write_text(json.dumps(WORD_TOKENIZER))
        tmp.replace(path)
    return path
