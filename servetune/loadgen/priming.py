"""Priming the server's prefix cache before a trial's warm-up, so its steady window starts warm.

A workload with shared system prompts or a pool of repeated images has a fixed number of first uses:
each one misses the cache, however long the trial. Left in the window they are a size-dependent tail:
on a simulated 8B VLM (two system prompts x 32 pooled images) p99 TTFT was 2,677 ms at 354 measured
requests and 178 ms at 600, the same config and rate. A service that has run for a while has seen its
shared parts (the cache evicts what it cannot keep), so before the warm-up the load sends one short
request (one output token) per distinct shared part that a measured request uses: its system prompt and
the run of pooled images it starts with, where they sit in the prompt. They go as a phase of their own
before the trial's clock starts (their completions, all at once, would otherwise open a closed loop's
window early), and the result counts them (``load.primers``). A timed trace replays its own requests as
recorded: it is not primed.
"""

from __future__ import annotations

from collections.abc import Sequence

from servetune.loadgen.config import LoadConfig
from servetune.workload.request import WorkloadRequest

PRIMER_INDEX = 1_000_000_000  # primers' request ids start here, clear of any workload's own


def shared_part(r: WorkloadRequest) -> tuple[str | None, tuple[str, ...]]:
    """What of ``r``'s prompt another request can share: its system prompt and, where they come ahead of
    the user's own text, the run of pooled images it starts with (images after the text share nothing)."""
    images = () if r.image_position == "after_text" else tuple(r.images[: r.pooled_images])
    if r.image_position == "before_system" and r.pooled_images < len(r.images):
        return None, images  # a unique image ahead of the system prompt: the prompt diverges there
    return r.system, images


def primers(measured: Sequence[WorkloadRequest]) -> list[WorkloadRequest]:
    """One short request per distinct shared part of ``measured``, in order of first use."""
    seen: dict[tuple[str | None, tuple[str, ...]], WorkloadRequest] = {}
    for r in measured:
        key = shared_part(r)
        if key in seen or key == (None, ()):
            continue
        system, images = key
        k = PRIMER_INDEX + len(seen)
        user = f"prime-{k}:"
        words = len(user.split()) + len((system or "").split())  # the requested length, as a record shows it
        seen[key] = WorkloadRequest(index=k, system=system, user=user, input_tokens=words,
                                    output_tokens=1, prefix_group=r.prefix_group if system is not None else -1,
                                    images=list(images), pooled_images=len(images), image_position=r.image_position)
    return list(seen.values())


def primers_for(requests: Sequence[WorkloadRequest], load: LoadConfig) -> list[WorkloadRequest]:
    """The primers a trial of ``requests`` under ``load`` sends first (none when the load says not to prime, or
    replays a trace)."""
    if not load.prime_cache or (load.mode == "rate" and load.arrival == "trace"):
        return []
    return primers(requests[load.warmup_requests:])


def priming_load(load: LoadConfig, n: int) -> LoadConfig:
    """How the primers go: a closed loop of up to the trial's own concurrency, no warm-up, done before the
    trial's clock starts (its window, telemetry and GPU curve see none of it)."""
    return LoadConfig(concurrency=max(1, min(load.concurrency, n)), prime_cache=False)
