"""The model's tokenizer, loaded locally, so prompts can be built to exact token lengths.

Counts are of the text alone (no special tokens, no chat template): what the engine adds
around it is a constant per request and is reported by the server's own usage.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import tokenizers


class Tokenizer:
    """A thin wrapper over ``tokenizers.Tokenizer`` with a stable name and content hash."""

    def __init__(self, inner: tokenizers.Tokenizer, *, name: str, sha256: str, path: str | None = None):
        self.inner = inner
        self.name = name
        self.sha256 = sha256  # of the tokenizer.json bytes: part of the workload fingerprint
        self.path = path

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text, add_special_tokens=False).ids

    def count(self, text: str) -> int:
        return len(self.inner.encode(text, add_special_tokens=False).ids)

    def count_batch(self, texts: list[str]) -> list[int]:
        return [len(e.ids) for e in self.inner.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self.inner.decode(ids, skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"Tokenizer(name={self.name!r}, sha256={self.sha256[:12]})"


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load ``path`` (a ``tokenizer.json`` or a model directory holding one); no network access."""
    p = Path(path).expanduser()
    if p.is_dir():
        file = p / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(
                f"tokenizer: {p} is a directory without tokenizer.json "
                "(only fast-tokenizer files are supported; save one with tokenizer.save_pretrained)"
            )
        name = p.resolve().name
    elif p.is_file():
        file = p
        name = p.resolve().parent.name if p.name == "tokenizer.json" else p.stem
    else:
        raise FileNotFoundError(
            f"tokenizer: {path} does not exist (give a local tokenizer.json or a model directory; "
            "hub ids are not downloaded)"
        )
    data = file.read_bytes()
    try:
        inner = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
    except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
        raise ValueError(f"tokenizer: {file} is not a valid tokenizer.json: {exc}") from exc
    return Tokenizer(inner, name=name, sha256=hashlib.sha256(data).hexdigest(), path=str(file))
