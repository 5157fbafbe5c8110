"""Dropping secrets from dicts that end up in logs and stored results."""

from __future__ import annotations

import re
from typing import Any

_SECRET_KEY = re.compile(
    r"(api[_-]?key|token(?!s)|secret|passw(or)?d|credential|auth(?!ors?$))", re.IGNORECASE
)
_TOKEN_COUNT_KEYS = re.compile(r"(tokens|token_(ratio|usage|ids?)|tokenizer)", re.IGNORECASE)


def is_secret_key(key: str) -> bool:
    """``api_key``, ``hf_token``, ``admin_password``... but not ``max_tokens`` or ``tokenizer_path``."""
    return bool(_SECRET_KEY.search(key)) and not _TOKEN_COUNT_KEYS.search(key)


def redact(value: Any) -> Any:
    """A copy of ``value`` without any mapping entry whose key names a secret (recursively)."""
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items() if not (isinstance(k, str) and is_secret_key(k))}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return value
