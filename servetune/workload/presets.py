"""Named workloads to start from; copy one and change what your traffic differs in.

Each preset's shortest prompt is longer than its system prompt, so the length distribution
is not distorted by prompts that the shared prefix alone would fill.
"""

from __future__ import annotations

from servetune.workload.spec import Fixed, Images, LogNormal, MultiTurn, SharedPrefix, WorkloadSpec

PRESETS: dict[str, WorkloadSpec] = {
    # typical chat traffic: one 512-token system prompt on 80% of requests
    "chat-default": WorkloadSpec(
        name="chat-default",
        input=LogNormal(median=1024, sigma=0.6, min=576, max=8192),
        output=LogNormal(median=192, sigma=0.5, min=16, max=1024),
        shared_prefix=SharedPrefix(tokens=512, share_ratio=0.8, num_prefixes=1),
    ),
    # RAG / document QA: long prompts, short answers, prefill-bound
    "long-context": WorkloadSpec(
        name="long-context",
        input=LogNormal(median=16384, sigma=0.4, min=4096, max=32768),
        output=LogNormal(median=256, sigma=0.5, min=32, max=1024),
        shared_prefix=SharedPrefix(tokens=1024, share_ratio=0.5, num_prefixes=4, zipf_s=1.1),
    ),
    # vision-language chat: one 1024x1024 image on 90% of requests, images mostly unique
    "vlm-chat": WorkloadSpec(
        name="vlm-chat",
        input=LogNormal(median=256, sigma=0.5, min=160, max=2048),
        output=LogNormal(median=192, sigma=0.5, min=16, max=1024),
        shared_prefix=SharedPrefix(tokens=128, share_ratio=1.0, num_prefixes=1),
        images=Images(count=1, width=1024, height=1024, ratio=0.9, distinct=0, format="jpeg"),
    ),
    # agents / few-shot templates: a handful of long system prompts with skewed popularity
    "shared-prefix-heavy": WorkloadSpec(
        name="shared-prefix-heavy",
        input=LogNormal(median=3072, sigma=0.3, min=2304, max=8192),
        output=LogNormal(median=128, sigma=0.5, min=16, max=512),
        shared_prefix=SharedPrefix(tokens=2048, share_ratio=1.0, num_prefixes=8, zipf_s=1.1),
    ),
    # multi-turn chat: users in 4-turn sessions, each turn sent after the last answer and a 1 s think time
    "multi-turn-chat": WorkloadSpec(
        name="multi-turn-chat",
        input=LogNormal(median=768, sigma=0.5, min=320, max=4096),
        output=LogNormal(median=160, sigma=0.5, min=16, max=512),
        shared_prefix=SharedPrefix(tokens=256, share_ratio=1.0, num_prefixes=1),
        multi_turn=MultiTurn(
            turns=4, turn_input=LogNormal(median=96, sigma=0.5, min=8, max=512), think_time_s=1.0
        ),
    ),
    # fixed lengths: the easiest workload to reason about and to compare engines on
    "fixed-1k-256": WorkloadSpec(name="fixed-1k-256", input=Fixed(value=1024), output=Fixed(value=256)),
}


def get_preset(name: str) -> WorkloadSpec:
    """A fresh copy of preset ``name`` (safe to modify)."""
    try:
        return PRESETS[name].model_copy(deep=True)
    except KeyError:
        raise KeyError(
            f"unknown workload preset {name!r}; known presets: {', '.join(sorted(PRESETS))}"
        ) from None
