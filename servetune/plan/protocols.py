"""A plan's ``protocols``: one-off measurements of the same server the way someone else measures it.

Two engineers who disagree about "the best batch size" usually measured different things: fixed
512-token prompts in one static batch with the prefix cache off and a decode-only tokens/s, against
lengths from a distribution, continuous batching, the cache on and an end-to-end p99. A protocol
states one such method (its workload changes, server flags, batching and the figure its author
quotes), runs once beside the campaign, and goes through the same checklist, so the report can put
each protocol's figure next to the tuned answer and say which of them the checklist accepts.
``servetune.plan.model`` validates them with the plan.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from servetune.engines.knobs import FlagValue, KnobError, with_flags
from servetune.workload.spec import WorkloadSpec

#: the figures a protocol's author may quote (TrialSummary fields, or a p99 of one)
Headline = Literal["decode_tokens_per_s", "output_tokens_per_s", "request_throughput", "goodput_rps",
                   "p99_ttft_ms", "p99_tpot_ms", "p99_e2e_ms"]
#: each figure's (label in a narrow table, unit)
HEADLINES: dict[str, tuple[str, str]] = {
    "decode_tokens_per_s": ("decode", "tok/s"), "output_tokens_per_s": ("output", "tok/s"),
    "request_throughput": ("throughput", "req/s"), "goodput_rps": ("goodput", "req/s"),
    "p99_ttft_ms": ("p99 TTFT", "ms"), "p99_tpot_ms": ("p99 TPOT", "ms"), "p99_e2e_ms": ("p99 E2E", "ms"),
}


class MeasurementProtocol(BaseModel):
    """How one engineer measures: the plan's workload with ``workload`` deep-merged over it, the
    engine's flags with ``flags`` over them, ``concurrency`` streams (``batching: static``: waves of that
    many, the next wave once the whole batch is done) and the figure ``headline`` they quote."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,39}$", description="short slug: engineer-a")
    about: str = Field(default="", max_length=300, description="the method in one line, shown in the report")
    workload: dict[str, Any] = Field(default_factory=dict, description="deep-merged over the plan's workload")
    flags: dict[str, FlagValue] = Field(default_factory=dict, description="server flags over the engine's own")
    batching: Literal["continuous", "static"] = "continuous"
    concurrency: int = Field(ge=1, description="streams; with batching static, the batch size")
    requests: int = Field(ge=1, description="measured requests")
    warmup: int = Field(default=0, ge=0)
    headline: Headline = "goodput_rps"


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` into ``base``, dicts merged key by key, anything else replaced (``None`` too); a dict
    naming another ``kind`` (a length distribution of another family) replaces the old one whole."""
    out = dict(base)
    for k, v in over.items():
        old = out.get(k)
        same_kind = isinstance(old, dict) and isinstance(v, dict) and v.get("kind", old.get("kind")) == old.get("kind")
        out[k] = deep_merge(old, v) if same_kind else v
    return out


def protocol_workload(plan_workload: WorkloadSpec, protocol: MeasurementProtocol) -> WorkloadSpec:
    """The protocol's workload: the plan's, with the protocol's changes (validated like any workload)."""
    if not protocol.workload:
        return plan_workload
    merged = deep_merge(plan_workload.model_dump(mode="json", exclude_none=False), protocol.workload)
    return WorkloadSpec.model_validate(merged)


def headline_value(summary: Any, headline: str) -> float | None:
    """The quoted figure from a trial's summary: a field, or ``p99_<metric>_ms`` from its percentiles."""
    if headline.startswith("p99_") and headline.endswith("_ms"):
        stats = getattr(summary, headline[4:], None)
        return getattr(stats, "p99", None)
    value = getattr(summary, headline, None)
    return float(value) if isinstance(value, int | float) else None


def check_protocols(protocols: list[MeasurementProtocol], workload: WorkloadSpec, engine: Any,
                    engine_flags: dict[str, Any]) -> None:
    """Each protocol's workload and flags, checked as the campaign's are: before any server starts."""
    names = [p.name for p in protocols]
    if len(set(names)) != len(names):
        raise ValueError(f"protocols: names must differ, got {names}")
    for i, p in enumerate(protocols):
        try:
            protocol_workload(workload, p)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ValueError(f"protocols[{i}].workload.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
        if p.flags and not engine.launches:
            raise ValueError(f"protocols[{i}].flags: an {engine.kind} engine cannot be restarted with new flags")
        try:
            with_flags(engine, {**engine_flags, **p.flags})
        except (KnobError, ValueError) as exc:
            raise ValueError(f"protocols[{i}].flags: the {engine.kind} engine refuses them: {exc}") from None
