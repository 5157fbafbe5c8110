"""The data the pure decisions read and write: trial specs, outcomes, the campaign state.

Everything is a pydantic model so an Airflow task can pass it through XCom as JSON and the
CLI can replay a campaign from its result folder.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from servetune.engines.knobs import Flags, FlagValue
from servetune.plan import Level
from servetune.result import ALL_STAGES, Stage, TrialResult, TrialSummary

__all__ = ["ALL_STAGES", "Stage"]  # defined beside TrialResult, which every layer may read
#: a trial's failure_reason starts with this when the engine died under it: a fault, not a verdict
ENGINE_CRASH = "engine_crash"
#: stages whose trials are not the level's load (one request; other arrivals; another method)
UNPAIRED: tuple[Stage, ...] = ("correctness", "robustness", "protocol")


def config_key(flags: Flags) -> str:
    """Stable short hash of a server configuration: two trials with the same key ran the same server."""
    return hashlib.sha256(orjson.dumps(flags, option=orjson.OPT_SORT_KEYS)).hexdigest()[:12]


class _AtALevel(BaseModel):
    """A trial's level: its streams, or the offered rate of an open loop; with its config, its key."""

    concurrency: int
    rate: float | None = None
    flags: Flags = Field(default_factory=dict)

    @property
    def level(self) -> Level:
        return self.rate if self.rate is not None else self.concurrency

    @property
    def key(self) -> tuple[str, Level]:
        return (config_key(self.flags), self.level)


class TrialSpec(_AtALevel):
    """One trial to run: the full server flags, the load level and why it was chosen."""

    model_config = ConfigDict(extra="forbid")

    stage: Stage
    concurrency: int = Field(ge=1, description="closed-loop streams; with ``rate``, the in-flight cap")
    rate: float | None = Field(default=None, gt=0, description="open loop: offered requests/s (the level)")
    burstiness: float | None = Field(default=None, gt=0, description="robustness: gamma arrivals of this shape")
    flags: Flags = Field(default_factory=dict)
    requests: int = Field(ge=1, description="measured requests")
    warmup: int = Field(default=0, ge=0)
    reason: str = ""
    seed_offset: int = Field(default=0, ge=0, description="added to the workload seed: each repeat sees new requests")
    sizing: str = Field(default="", description="how the request count was chosen (servetune.tuning.sizing)")
    protocol: str | None = Field(default=None, description="the plan's protocol this trial measures (its workload"
                                 " and batching instead of the plan's)")


class TrialOutcome(_AtALevel):
    """What the decisions need from one finished trial (the full TrialResult stays on disk)."""

    model_config = ConfigDict(extra="forbid")

    trial_id: str
    stage: Stage
    burstiness: float | None = None
    requests: int = Field(default=0, ge=0, description="measured requests asked for (comparisons keep it equal)")
    warmup: int = Field(default=0, ge=0)
    status: Literal["ok", "failed", "rejected"] = Field(
        default="ok", description="rejected: the report checklist failed it (kept, never evidence)")
    failure_reason: str | None = None
    summary: TrialSummary = Field(default_factory=TrialSummary)
    gpu_seconds: float = Field(default=0.0, ge=0, description="trial time plus any server (re)start")
    restarted: bool = False
    startup_seconds: float = Field(default=0.0, ge=0, description="of gpu_seconds: the server's (re)start and its"
                                   " unmeasured warm-up (budget.warmup_after_start)")
    resolved: dict[str, FlagValue] = Field(
        default_factory=dict, description="scalar server args as the server resolved them (/server_info)"
    )
    seed_offset: int = Field(default=0, ge=0)

    @property
    def valid(self) -> bool:
        """A VALID measurement the checklist accepted (servetune.validity, servetune.validation); results
        from before the rules existed count as valid."""
        return self.status == "ok" and self.summary.valid is not False

    @property
    def rejected(self) -> bool:
        """Measured, but the report checklist failed it: kept and shown, never evidence."""
        return self.status == "rejected"

    @property
    def fault(self) -> bool:
        """The engine died under this trial: it says nothing about the config or the level."""
        return self.status == "failed" and (self.failure_reason or "").startswith(ENGINE_CRASH)

    @classmethod
    def from_result(
        cls, spec: TrialSpec, result: TrialResult, *, gpu_seconds: float, restarted: bool, startup_seconds: float = 0.0
    ) -> TrialOutcome:
        status: Literal["ok", "failed", "rejected"] = (
            result.status if result.status in ("failed", "rejected") else "ok")  # type: ignore[assignment]
        return cls(
            trial_id=result.trial_id,
            stage=spec.stage,
            concurrency=spec.concurrency,
            rate=spec.rate,
            burstiness=spec.burstiness,
            flags=dict(spec.flags),
            requests=spec.requests,
            warmup=spec.warmup,
            seed_offset=spec.seed_offset,
            status=status,
            failure_reason=result.failure_reason,
            summary=result.summary,
            gpu_seconds=gpu_seconds,
            restarted=restarted,
            startup_seconds=min(startup_seconds, gpu_seconds),
            resolved=resolved_args(result),
        )


def resolved_args(result: TrialResult) -> dict[str, FlagValue]:
    """The server's resolved scalar args (what an unset flag defaulted to), from its /server_info."""
    info = (result.server or {}).get("server_info") or {}
    return {k: v for k, v in info.items() if isinstance(v, int | float | str | bool) and k != "api_key"}


class CampaignState(BaseModel):
    """Every outcome so far, in the order the trials ran."""

    model_config = ConfigDict(extra="forbid")

    outcomes: list[TrialOutcome] = Field(default_factory=list)
    #: figures derived from the outcomes (a state never changes: ``add`` makes a new one)
    _derived: dict[str, Any] = PrivateAttr(default_factory=dict)

    def lookup(self, flags: Flags, level: Level) -> TrialOutcome | None:
        """The latest measurement of this server config at this level, from any stage."""
        found = self.measurements(flags, level)
        return found[-1] if found else None

    def measurements(self, flags: Flags, level: Level) -> list[TrialOutcome]:
        """Every trial of this server config at this level (repeats and invalid ones), any stage but correctness
        and robustness (other arrivals: not the level's load)."""
        key = (config_key(flags), level)
        return [o for o in self.outcomes if o.stage not in UNPAIRED and o.key == key]

    def at_level(self, level: Level) -> list[TrialOutcome]:
        """Every trial at ``level``, any config (what a level's trial size is read from)."""
        return [o for o in self.outcomes if o.stage not in UNPAIRED and o.level == level]

    def by_stage(self, stage: Stage) -> list[TrialOutcome]:
        return [o for o in self.outcomes if o.stage == stage]

    @property
    def gpu_seconds(self) -> float:
        return sum(o.gpu_seconds for o in self.outcomes)

    @property
    def server_starts(self) -> int:
        return sum(1 for o in self.outcomes if o.restarted)

    @property
    def startup_seconds(self) -> float:
        """GPU seconds of start-ups and their warm-ups (the warm-up comes with a server's first measured trial)."""
        return sum(o.startup_seconds for o in self.outcomes)

    def add(self, outcome: TrialOutcome) -> CampaignState:
        return CampaignState(outcomes=[*self.outcomes, outcome])


class Verdict(BaseModel):
    """Whether one trial met the plan's limits, and if not, every reason why."""

    model_config = ConfigDict(extra="forbid")

    passed: bool
    kind: Literal["pass", "sla", "memory", "errors", "failed", "invalid", "overload", "fault"] = "pass"
    reasons: list[str] = Field(default_factory=list)


class Ceiling(BaseModel):
    """Where the ramp stopped and why."""

    model_config = ConfigDict(extra="forbid")

    level: Level | None = Field(description="the best accepted level (most goodput; streams or req/s); None when"
                                            " nothing passed")
    highest_pass: Level | None = Field(default=None, description="the highest level that passed (above ``level``"
                                                                 " on a plateau)")
    kind: Literal["sla", "memory", "errors", "failed", "plateau", "exhausted", "budget", "invalid", "overload",
                  "fault"]
    first_fail: Level | None = None
    reasons: list[str] = Field(default_factory=list)
    pass_trial_id: str | None = None
    fail_trial_id: str | None = None
    pass_trial_ids: list[str] = Field(default_factory=list, description="every valid repeat at the level")
    fail_trial_ids: list[str] = Field(default_factory=list, description="every valid repeat at first_fail")
    marginal: list[Level] = Field(default_factory=list, description="levels whose SLA verdict flipped between repeats")


class TrialSize(BaseModel):
    """The size an answer's trials ran at; read back from last week's recommendation.json, so bounded here."""

    model_config = ConfigDict(extra="forbid", strict=True)

    requests: int = Field(gt=0, le=10_000_000, description="measured requests")
    warmup: int = Field(ge=0, le=10_000_000, description="unmeasured warm-up requests before them")


class Recommendation(BaseModel):
    """The campaign's answer; written as recommendation.json (layout shared with warehouse and report)."""

    model_config = ConfigDict(extra="forbid")

    config: Flags
    concurrency: int = Field(
        description="streams; in rate mode the in-flight level the capacity implies (Little's law)")
    rate: float | None = Field(default=None, description="rate mode: the capacity, requests/s at the SLA")
    evidence_trial_ids: list[str]
    goodput_rps: float | None
    p99_ttft_ms: float | None
    p99_tpot_ms: float | None
    p99_e2e_ms: float | None
    output_tokens_per_s: float | None
    prefix_hit_rate: float | None
    explanation: list[str]
    diff_from_previous: dict[str, Any] | None = None
    vs_deployed: dict[str, Any] | None = Field(
        default=None, description="the plan's own flags at the answer's level, where the answer changed a flag"
                                  " (servetune.tuning.deployed)")
    repeats: int = Field(default=1, description="valid trials of the chosen config at its level")
    goodput_ci95: float | None = Field(default=None, description="half-width of the 95% interval of the mean goodput")
    goodput_cv: float | None = None
    ties: list[str] = Field(default_factory=list, description="comparisons decided as ties within the noise")
    robustness: list[dict[str, Any]] = Field(
        default_factory=list, description="the answer under bursts: fraction, rate, burstiness, verdict, p99s, trial")
    objective: str = Field(default="goodput", description="what chose the level (servetune.tuning.objective)")
    energy_per_output_token_j: float | None = Field(default=None, description="J per output token, all GPUs")
    gpu_power_window_mean_w: float | None = None
    cost_per_mtok_usd: float | None = Field(default=None, description="at the plan's cost.gpu_hour_usd")
    cost_per_1k_good_usd: float | None = None
    trial_size: TrialSize | None = Field(
        default=None, description="requests and warm-up of the answer's trials: a warm start confirms it at this size")


class Decision(BaseModel):
    """What to do next: trials to run (in order), or done with the reason and the recommendation."""

    model_config = ConfigDict(extra="forbid")

    stage: Literal[Stage, "done"]
    trials: list[TrialSpec] = Field(default_factory=list)
    done: bool = False
    reason: str = ""
    ceiling: Ceiling | None = None
    recommendation: Recommendation | None = None
    failed: bool = Field(default=False, description="done without a usable answer (correctness, stop-on-failure)")
