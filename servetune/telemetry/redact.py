"""Secrets out of what a server says about itself: the policy of ``servetune.redact``, entries dropped.

A server's own account (``/server_info``) is recorded, not ours to keep: secret-named entries are
left out entirely rather than masked.
"""

from __future__ import annotations

from typing import Any

from servetune.redact import drop_secrets, is_secret_key

__all__ = ["is_secret_key", "redact"]


def redact(value: Any) -> Any:
    """A copy of ``value`` without any mapping entry whose key names a secret (recursively)."""
    return drop_secrets(value)
