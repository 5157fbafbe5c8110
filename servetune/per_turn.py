"""Per-turn figures of a multi-turn trial: each later turn resends a longer history, so its prompt, its
TTFT and (where the engine caches) its cached tokens should grow with the turn index; one row per turn."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from servetune.records import RequestRecord


def by_turn(ok: Sequence[RequestRecord]) -> list[dict[str, Any]] | None:
    """Rows ``{turn, requests, ttft_p50_ms, ttft_p99_ms, e2e_p50_ms, prompt_tokens_mean, cached_tokens_mean,
    hit_rate}`` over the window's successful requests; None for a single-turn workload."""
    if not any(r.turn for r in ok):
        return None
    rows = []
    for turn in sorted({r.turn for r in ok}):
        rs = [r for r in ok if r.turn == turn]
        ttft = [r.ttft_ms for r in rs if r.ttft_ms is not None]
        e2e = [r.e2e_ms for r in rs if r.e2e_ms is not None]
        both = [r for r in rs if r.prompt_tokens is not None and r.cached_tokens is not None]
        prompt = sum(r.prompt_tokens or 0 for r in both)
        rows.append({
            "turn": turn,
            "requests": len(rs),
            "ttft_p50_ms": float(np.percentile(ttft, 50)) if ttft else None,
            "ttft_p99_ms": float(np.percentile(ttft, 99)) if ttft else None,
            "e2e_p50_ms": float(np.percentile(e2e, 50)) if e2e else None,
            "prompt_tokens_mean": (float(np.mean([r.prompt_tokens for r in rs if r.prompt_tokens is not None]))
                                   if any(r.prompt_tokens is not None for r in rs) else None),
            "cached_tokens_mean": float(np.mean([r.cached_tokens for r in both])) if both else None,
            "hit_rate": sum(r.cached_tokens or 0 for r in both) / prompt if prompt else None,
        })
    return rows
