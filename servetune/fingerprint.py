"""Fingerprints of what a tuning result depends on: the model and the prompt template.

A recommendation is only valid for the model weights and the prompt template it was measured
with (a new template can halve the prefix-cache hit rate: 60% -> 20% has been seen). The
watcher re-tunes when either fingerprint changes, so the hashes must change on a real change
and on nothing else: file contents, never mtimes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

# Files that define a model's identity without reading gigabytes of weights: the architecture,
# the weight index (shard names and tensor -> shard map, which changes with any re-export) and the
# tokenizer. Weight shards themselves are represented by name and size.
_MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json",
                "pytorch_model.bin.index.json", "tokenizer.json", "tokenizer_config.json")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")


@dataclass(frozen=True)
class Fingerprint:
    kind: str  # "model" | "prompt_template"
    name: str  # a stable slug used in asset URIs
    source: str  # path (or id) it was computed from
    digest: str  # sha256 hex, truncated to 16 chars
    parts: tuple[str, ...]  # what went into it, for humans

    @property
    def asset_uri(self) -> str:
        return f"servetune://{self.kind.replace('_', '-')}/{self.name}"


def slug(text: str) -> str:
    keep = [c if c.isalnum() or c in "-._" else "-" for c in text.strip("/").lower()]
    return "".join(keep).strip("-")[:120] or "unnamed"


def model_fingerprint(model: str, name: str | None = None) -> Fingerprint:
    """Hash of a local model directory's config, weight index and shard list.

    A model given as a hub id (not a local directory) is fingerprinted by its id alone, and the
    parts say so: servetune never downloads weights to fingerprint them.
    """
    h = hashlib.sha256()
    parts: list[str] = []
    path = Path(model)
    if path.is_dir():
        for fname in _MODEL_FILES:
            f = path / fname
            if f.is_file():
                h.update(fname.encode() + b"\0" + f.read_bytes() + b"\0")
                parts.append(fname)
        for f in sorted(p for p in path.iterdir() if p.suffix in _WEIGHT_SUFFIXES and p.is_file()):
            h.update(f"{f.name}:{f.stat().st_size}\0".encode())
            parts.append(f"{f.name} ({f.stat().st_size} B)")
        if not parts:
            raise FileNotFoundError(f"{model}: no config.json, weight index or weights to fingerprint")
    else:
        h.update(b"id:" + model.encode())
        parts.append("hub id only (not a local directory)")
    return Fingerprint("model", slug(name or model), model, h.hexdigest()[:16], tuple(parts))


def prompt_template_fingerprint(source: str, name: str | None = None) -> Fingerprint:
    """Hash of a prompt template: a template file, or the chat template inside a model directory."""
    path = Path(source)
    if path.is_dir():
        cfg = path / "tokenizer_config.json"
        if not cfg.is_file():
            raise FileNotFoundError(f"{source}: no tokenizer_config.json holding a chat template")
        template = json.loads(cfg.read_text()).get("chat_template")
        if template is None and (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()
        if template is None:
            raise ValueError(f"{source}: tokenizer_config.json has no chat_template")
        data, part = json.dumps(template, sort_keys=True).encode(), "tokenizer_config.json:chat_template"
    elif path.is_file():
        data, part = path.read_bytes(), path.name
    else:
        raise FileNotFoundError(f"{source}: prompt template not found")
    digest = hashlib.sha256(data).hexdigest()[:16]
    return Fingerprint("prompt_template", slug(name or source), source, digest, (part,))
