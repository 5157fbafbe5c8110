"""Rule 3: the prefix-cache audit. What the workload was built to share against what the cache served.

Shareable tokens per request come from the workload's design: a request carrying a shared system prompt
(``prefix_group >= 0``) can reuse ``shared_prefix.tokens``; a conversation's later turn can reuse the
previous turn's prompt and answer (its history). Measured: usage ``cached_tokens`` (else the server's
counter hit rate). A cache serving under ``EFFECTIVE_MIN`` of the shareable tokens is "not effective",
with the likely cause read from the spec and the figures (docs/diagnoses.md). Eviction under pressure is
a pool near full while the hits fall over the window.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from servetune.diagnose import Finding, flag, r3, workload_spec
from servetune.records import RequestRecord
from servetune.result import TrialResult

EFFECTIVE_MIN = 0.5  # cached / shareable under this: the cache is not effective
NONCE_MAX = 0.1  # median per-request cached / shareable under this: nothing past the first tokens matched
EVICTION_USAGE = 0.9  # KV pool occupancy (token usage) at or above: under pressure
EVICTION_FALL = 0.7  # hit rate of the window's last third under 70% of its first third: hits falling
SOURCES_DISAGREE = 0.1  # |usage hit rate - counter hit rate| above: the two sources disagree
MIN_REQUESTS = 10  # fewer measured requests with something to share: no verdict


def shareable(records: list[RequestRecord], spec: dict[str, Any]) -> list[int]:
    """Designed shareable prompt tokens per record (in ``records`` order, first of a group or session 0)."""
    prefix = (spec.get("shared_prefix") or {}).get("tokens") or 0
    seen_groups: set[int] = set()
    last_turn: dict[int, RequestRecord] = {}
    out: dict[int, int] = {}  # id(record) -> shareable tokens
    for r in sorted(records, key=lambda r: r.t_send_s):
        n = 0
        if prefix and r.prefix_group is not None and r.prefix_group >= 0:
            n += prefix if r.prefix_group in seen_groups else 0
            seen_groups.add(r.prefix_group)
        prev = last_turn.get(r.session) if r.session >= 0 else None
        if prev is not None and r.turn > prev.turn:
            n = max(n, (prev.prompt_tokens or prev.requested_input_tokens or 0) + (prev.completion_tokens or 0))
        if r.session >= 0:
            last_turn[r.session] = r
        out[id(r)] = n
    return [out[id(r)] for r in records]


def _thirds(records: list[RequestRecord], designed: list[int]) -> tuple[float | None, float | None]:
    """Cached / shareable over the first and the last third of the window's requests (by send time)."""
    pairs = sorted(((r.t_send_s, r.cached_tokens or 0, d) for r, d in zip(records, designed, strict=True) if d > 0
                    and r.cached_tokens is not None))
    if len(pairs) < 3 * MIN_REQUESTS // 2:
        return None, None
    k = len(pairs) // 3

    def rate(part: list[tuple[float, int, int]]) -> float | None:
        den = sum(p[2] for p in part)
        return sum(min(p[1], p[2]) for p in part) / den if den else None

    return rate(pairs[:k]), rate(pairs[-k:])


def _cause(result: TrialResult, spec: dict[str, Any], records: list[RequestRecord], designed: list[int],
           usage_max: float | None, ev: dict[str, Any]) -> tuple[str, str]:
    """(cause, advice) of a cache that served too little, the most specific first."""
    images = spec.get("images") or {}
    if flag(result, "disable_radix_cache") in (True, "true", "True", 1):
        return ("the radix cache is disabled (--disable-radix-cache)", "start the server without --disable-radix-cache")
    if images.get("position") == "before_system" and any(r.n_images for r in records):
        return ("images sit ahead of the system prompt (images.position: before_system): every prompt with its own"
                " image starts differently, so nothing after it is shared",
                "put images after the system prompt (images.position: before_text) or reuse them (images.distinct)")
    per = [min(r.cached_tokens or 0, d) / d for r, d in zip(records, designed, strict=True)
           if d > 0 and r.cached_tokens is not None]
    if per:
        ev["cached_share_median"] = r3(float(np.median(per)))
        ev["cached_tokens_median"] = r3(float(np.median(
            [r.cached_tokens or 0 for r, d in zip(records, designed, strict=True) if d > 0])))
    if per and float(np.median(per)) < NONCE_MAX:
        return ("a per-request nonce (or other unique text) ahead of the shared part: only the first"
                f" {ev['cached_tokens_median']:.0f} tokens of each prompt (the template's) match",
                "move anything unique per request (ids, timestamps, nonces) after the shared prefix")
    if usage_max is not None and usage_max >= EVICTION_USAGE:
        return (f"eviction under pressure: the KV pool ran {usage_max:.0%} full",
                "give the pool more room (raise --mem-fraction-static where the GPU has headroom) or lower"
                " --max-running-requests")
    return ("partial matches: the shared text changes between requests (a changed or unstable prompt template?)",
            "compare the prompt-template fingerprints of the runs (query cache_hit_regressions) and render the"
            " shared part identically for every request")


def diagnose(result: TrialResult) -> list[Finding]:
    tid, s = result.trial_id, result.summary
    spec = workload_spec(result)
    records = [r for r in result.records if not r.warmup and r.ok]
    designed = shareable(records, spec)
    prompt_total = sum(r.prompt_tokens or r.requested_input_tokens or 0 for r in records)
    designed_total = sum(designed)
    reporting = [r for r in records if r.cached_tokens is not None]
    usage_max = s.server_token_usage_max if s.server_token_usage_max is not None else s.sched_token_usage_max
    ev: dict[str, Any] = {
        "requests": len(records),
        "shareable_tokens_per_request": r3(designed_total / len(records)) if records else None,
        "expected_hit_rate": r3(designed_total / prompt_total) if prompt_total else None,
        "prefix_hit_rate": r3(s.prefix_hit_rate), "prefix_hit_rate_server": r3(s.prefix_hit_rate_server),
        "token_usage_max": r3(usage_max),
    }
    out: list[Finding] = []
    if s.prefix_hit_rate is not None and s.prefix_hit_rate_server is not None \
            and abs(s.prefix_hit_rate - s.prefix_hit_rate_server) > SOURCES_DISAGREE:
        out.append(Finding(trial_id=tid, kind="prefix_cache.sources_disagree", severity="info", evidence=dict(ev),
                           summary=f"usage says {s.prefix_hit_rate:.1%} cached, the server's counters"
                                   f" {s.prefix_hit_rate_server:.1%} (the counters include the warm-up)"))
    if sum(d > 0 for d in designed) < MIN_REQUESTS:
        out.append(Finding(trial_id=tid, kind="prefix_cache.nothing_to_share", severity="info", evidence=ev,
                           summary="the workload shares (almost) nothing by design (no shared prefix, no later turns):"
                                   f" measured hit rate {_pct(s.prefix_hit_rate)}"))
        return out
    if reporting:
        cached = sum(min(r.cached_tokens or 0, d) for r, d in zip(records, designed, strict=True)
                     if r.cached_tokens is not None)
        designed_rep = sum(d for r, d in zip(records, designed, strict=True) if r.cached_tokens is not None)
        source = "usage"
    elif s.prefix_hit_rate_server is not None:
        cached, designed_rep, source = s.prefix_hit_rate_server * prompt_total, designed_total, "counters"
    else:
        out.append(Finding(trial_id=tid, kind="prefix_cache.unknown", severity="info", evidence=ev,
                           summary="no cached-token count (usage or counters): the cache cannot be audited",
                           advice="start SGLang with --enable-cache-report (and --enable-metrics)"))
        return out
    effectiveness = cached / designed_rep if designed_rep else 0.0
    ev.update(measured_source=source, cached_of_shareable=r3(effectiveness))
    first, last = _thirds(records, designed)
    ev.update(hit_first_third=r3(first), hit_last_third=r3(last))
    if usage_max is not None and usage_max >= EVICTION_USAGE and first and last is not None \
            and last < EVICTION_FALL * first:
        out.append(Finding(
            trial_id=tid, kind="prefix_cache.eviction", severity="warning", evidence=dict(ev),
            summary=f"eviction under pressure: the KV pool ran {usage_max:.0%} full while the cached share of the"
                    f" shareable tokens fell from {first:.0%} to {last:.0%} over the window",
            advice="give the pool more room (raise --mem-fraction-static where the GPU has headroom) or lower"
                   " --max-running-requests"))
    if effectiveness >= EFFECTIVE_MIN:
        out.append(Finding(
            trial_id=tid, kind="prefix_cache.effective", severity="info", evidence=ev,
            summary=f"cache effective: {effectiveness:.0%} of the {designed_total / len(records):.0f} shareable"
                    f" tokens per request served from cache (hit rate {_pct(s.prefix_hit_rate)}, expected"
                    f" {_pct(ev['expected_hit_rate'])})"))
        return out
    cause, advice = _cause(result, spec, records, designed, usage_max, ev)
    ev["likely_cause"] = cause
    out.append(Finding(
        trial_id=tid, kind="prefix_cache.not_effective", severity="warning", evidence=ev, advice=advice,
        summary=f"cache not effective: {effectiveness:.0%} of the shareable tokens were cached (hit rate"
                f" {_pct(s.prefix_hit_rate)}, the workload's design allows {_pct(ev['expected_hit_rate'])});"
                f" likely cause: {cause}"))
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"
