"""Priming the server's prefix cache before a trial's warm-up, so its steady window starts warm.

A workload with shared system prompts or a pool of repeated images has a fixed number of first uses:
each one misses the cache, however long the trial. Left in the window they are a size-dependent tail:
on a simulated 8B VLM (two system prompts x 32 pooled images, 56 streams) p99 TTFT was 2,839 ms at 354
measured requests and 162 ms at 1,000, the same config (392 and 132 ms primed). A service that has run
for a while has seen its shared parts (the cache evicts what it cannot keep), so before the warm-up the
load sends one short request (one output token) per shared head that a measured request uses: its system
prompt and the run of pooled images it starts with, where they sit in the prompt, as far as at least two
of the trial's requests share them. They go as a phase of their own before the trial's clock starts (their
completions, all at once, would otherwise open a closed loop's window early), and the result counts them
(``load.primers``). A timed trace replays its own requests as recorded: it is not primed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from servetune.loadgen.config import LoadConfig
from servetune.workload.request import WorkloadRequest

PRIMER_INDEX = 1_000_000_000  # primers' request ids start here, clear of any workload's own
Segment = tuple[str, str]  # ("system", its text) or ("image", its URL), in prompt order


def shared_segments(r: WorkloadRequest) -> tuple[Segment, ...]:
    """The head of ``r``'s prompt that another request could share, in prompt order: its system prompt and
    the run of pooled images ahead of the user's own text (images after the text share nothing; a unique
    image ahead of the system prompt ends the head there)."""
    pooled = () if r.image_position == "after_text" else tuple(("image", u) for u in r.images[: r.pooled_images])
    system = (("system", r.system),) if r.system is not None else ()
    if r.image_position == "before_system":
        return pooled + (system if r.pooled_images == len(r.images) else ())
    return system + pooled


def primers(measured: Sequence[WorkloadRequest],
            among: Sequence[WorkloadRequest] | None = None) -> list[WorkloadRequest]:
    """One short request per shared head of ``measured``, in order of first use: a request's longest head
    that at least two requests of ``among`` (default: ``measured``) begin with. A head only one request has
    is not shared (a system prompt with a nonce in it): priming it would warm that request alone."""
    among = measured if among is None else among
    uses: Counter[tuple[Segment, ...]] = Counter()
    for r in among:
        segs = shared_segments(r)
        uses.update(segs[:k] for k in range(1, len(segs) + 1))
    heads: dict[tuple[Segment, ...], WorkloadRequest] = {}
    for r in measured:
        segs = shared_segments(r)
        k = max((k for k in range(1, len(segs) + 1) if uses[segs[:k]] >= 2), default=0)
        if k:
            heads.setdefault(segs[:k], r)
    longest = [h for h in heads if not any(len(o) > len(h) and o[: len(h)] == h for o in heads)]
    return [_primer(PRIMER_INDEX + n, h, heads[h]) for n, h in enumerate(longest)]


def _primer(index: int, head: tuple[Segment, ...], like: WorkloadRequest) -> WorkloadRequest:
    """A one-token request whose prompt opens with ``head``, laid out as ``like``'s."""
    system = next((text for kind, text in head if kind == "system"), None)
    images = [url for kind, url in head if kind == "image"]
    user = f"prime-{index}:"
    return WorkloadRequest(index=index, system=system, user=user,
                           input_tokens=len(user.split()) + len((system or "").split()),  # as a record shows it
                           output_tokens=1, prefix_group=like.prefix_group if system is not None else -1,
                           images=images, pooled_images=len(images), image_position=like.image_position)


def primers_for(requests: Sequence[WorkloadRequest], load: LoadConfig) -> list[WorkloadRequest]:
    """The primers a trial of ``requests`` under ``load`` sends first (none when the load says not to prime, or
    replays a trace)."""
    if not load.prime_cache or (load.mode == "rate" and load.arrival == "trace"):
        return []
    return primers(requests[load.warmup_requests:], requests)


def priming_load(load: LoadConfig, n: int) -> LoadConfig:
    """How the primers go: a closed loop of up to the trial's own concurrency, no warm-up, done before the
    trial's clock starts (its window, telemetry and GPU curve see none of it)."""
    return LoadConfig(concurrency=max(1, min(load.concurrency, n)), prime_cache=False)
