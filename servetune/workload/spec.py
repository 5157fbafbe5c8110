"""What a workload is, as data: length distributions, shared prefixes, images, turns.

The spec (and its fingerprint) travels with every result so two numbers are only ever
compared when they were measured on the same load.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from servetune.workload.trace import TraceReplay

#: size limits checked before any work: beyond any served context (10M tokens) or image a VLM takes (16k px a side)
MAX_TOKENS = 10_000_000
MAX_IMAGE_SIDE = 16_384


class _Dist(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _check_bounds(lo: int, hi: int | None) -> None:
    if hi is not None and lo > hi:
        raise ValueError(f"min ({lo}) > max ({hi})")


class Fixed(_Dist):
    kind: Literal["fixed"] = "fixed"
    value: int = Field(ge=1, le=MAX_TOKENS)


class Uniform(_Dist):
    kind: Literal["uniform"] = "uniform"
    min: int = Field(ge=1, le=MAX_TOKENS)
    max: int = Field(ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) > max ({self.max})")
        return self


class Normal(_Dist):
    """Normal with hard bounds (resampled, not clipped, so the bounds hold no mass spike)."""

    kind: Literal["normal"] = "normal"
    mean: float = Field(gt=0, le=MAX_TOKENS)
    std: float = Field(ge=0)
    min: int = Field(default=1, ge=1, le=MAX_TOKENS)
    max: int | None = Field(default=None, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _ordered(self) -> Normal:
        _check_bounds(self.min, self.max)
        return self


class LogNormal(_Dist):
    """Log-normal given by its median and sigma (of the log), with hard bounds."""

    kind: Literal["lognormal"] = "lognormal"
    median: float = Field(gt=0, le=MAX_TOKENS)
    sigma: float = Field(ge=0)
    min: int = Field(default=1, ge=1, le=MAX_TOKENS)
    max: int | None = Field(default=None, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _ordered(self) -> LogNormal:
        _check_bounds(self.min, self.max)
        return self


class Empirical(_Dist):
    """Lengths drawn from a JSONL trace of real requests (one object per line)."""

    kind: Literal["empirical"] = "empirical"
    path: str
    field: str = Field(description="key of the length in each JSONL object, e.g. input_tokens")
    scale: float = Field(default=1.0, gt=0)
    min: int = Field(default=1, ge=1, le=MAX_TOKENS)
    max: int | None = Field(default=None, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _ordered(self) -> Empirical:
        _check_bounds(self.min, self.max)
        return self


SimpleDist = Annotated[Fixed | Uniform | Normal | LogNormal | Empirical, Field(discriminator="kind")]


class MixturePart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    weight: float = Field(gt=0, description="relative weight (the parts' weights are normalised)")
    dist: SimpleDist


class Mixture(_Dist):
    """A weighted mix of distributions: e.g. 90% chat-sized prompts and 10% long 16k documents."""

    kind: Literal["mixture"] = "mixture"
    parts: list[MixturePart] = Field(min_length=1)


LengthDist = Annotated[Fixed | Uniform | Normal | LogNormal | Empirical | Mixture, Field(discriminator="kind")]


class SharedPrefix(BaseModel):
    """A shared system prompt, so the radix cache has something to reuse."""

    model_config = ConfigDict(extra="forbid")

    tokens: int = Field(ge=1, description="length of each system prompt in tokens")
    share_ratio: float = Field(default=1.0, ge=0, le=1, description="fraction of requests that carry one")
    num_prefixes: int = Field(default=1, ge=1, description="distinct system prompts")
    zipf_s: float = Field(default=1.1, ge=0, description="popularity skew over prefixes (0 = uniform)")


class Images(BaseModel):
    """Images attached to chat messages (VLM workloads)."""

    model_config = ConfigDict(extra="forbid")

    count: int = Field(default=1, ge=1, le=64, description="images per request that has any")
    width: int = Field(default=512, ge=8, le=MAX_IMAGE_SIDE)
    height: int = Field(default=512, ge=8, le=MAX_IMAGE_SIDE)
    ratio: float = Field(default=1.0, ge=0, le=1, description="fraction of requests with images")
    distinct: int = Field(default=0, ge=0, le=100_000,
                          description="size of the pool repeated images come from (0: no pool)")
    reuse_ratio: float = Field(default=1.0, ge=0, le=1,
                               description="with a pool: fraction of images drawn from it (the rest unique)")
    position: Literal["before_text", "after_text", "before_system"] = Field(
        default="before_text", description="where the images sit: ahead of the user's text (after the system"
                                           " prompt), after it, or ahead of the system prompt (which breaks the"
                                           " shared prefix: every request's prompt starts differently)")
    format: Literal["png", "jpeg"] = "png"
    transport: Literal["data_url", "http"] = Field(
        default="data_url", description="how requests carry them: base64 data URLs in the body, or the URLs of an"
                                        " HTTP server the load runs on `host` (servetune.loadgen.image_server)")
    host: str = Field(default="127.0.0.1", description="transport http: the address it binds, which the engine"
                                                       " fetches from (loopback: an engine on this host)")


class MultiTurn(BaseModel):
    """Conversations: each later turn resends the history plus a new user message.

    ``sessions`` (the default) is how users talk: a conversation is the load unit, turn k+1 is sent
    only once turn k's answer has arrived, with that answer's text in its history, after a think time.
    ``scripted`` sends every turn as an independent request with stand-in answers (the old way:
    reproducible prompts, but a turn can be sent before its predecessor's answer exists).
    """

    model_config = ConfigDict(extra="forbid")

    turns: int = Field(default=2, ge=1, le=1000)
    turn_input: LengthDist = Field(default_factory=lambda: Fixed(value=64), description="new user tokens per turn")
    mode: Literal["sessions", "scripted"] = "sessions"
    think_time_s: float = Field(default=0.0, ge=0, description="sessions: mean pause between an answer and the"
                                                                " next turn (exponential, seeded; 0: none)")
    interleave: int = Field(
        default=1,
        ge=1,
        description="scripted: conversations whose turns are sent round-robin (1: a conversation's turns back to back)",
    )

    @model_validator(mode="after")
    def _mode_fields(self) -> MultiTurn:
        if self.mode == "sessions" and self.interleave != 1:
            raise ValueError("interleave applies to mode: scripted (sessions send a turn after its predecessor's"
                             " answer, whatever the order)")
        if self.mode == "scripted" and self.think_time_s:
            raise ValueError("think_time_s applies to mode: sessions")
        return self


class WorkloadSpec(BaseModel):
    """Deterministic by ``seed``: the same spec always yields the same requests."""

    model_config = ConfigDict(extra="forbid")

    name: str = "default"
    seed: int = Field(default=0, ge=0)
    input: LengthDist = Field(default_factory=lambda: LogNormal(median=1024, sigma=0.6, min=64, max=4096))
    output: LengthDist = Field(default_factory=lambda: LogNormal(median=192, sigma=0.5, min=16, max=1024))
    shared_prefix: SharedPrefix | None = None
    images: Images | None = None
    multi_turn: MultiTurn | None = None
    tokenizer: str | None = Field(default=None, description="path to a tokenizer.json or HF model dir")
    ignore_eos: bool = True  # ask the server to generate exactly the requested output length
    temperature: float = 0.0
    trace: TraceReplay | None = Field(  # left out of dumps when unset: older fingerprints and digests hold
        default=None, exclude_if=lambda v: v is None,
        description="timed trace replay: each request's lengths and arrival from a row (input, output and"
                    " shared_prefix are then ignored)")

    def fingerprint(self) -> str:
        """Stable hash of the spec (and of any trace file's contents) for comparing results."""
        data = self.model_dump(mode="json", exclude={"images": {"transport", "host"}})  # how they travel: not what
        h = hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS))
        for top in (self.input, self.output):
            for dist in ([part.dist for part in top.parts] if isinstance(top, Mixture) else [top]):
                if isinstance(dist, Empirical) and Path(dist.path).is_file():
                    h.update(Path(dist.path).read_bytes())
        if self.trace is not None and Path(self.trace.path).is_file():
            h.update(Path(self.trace.path).read_bytes())
        return h.hexdigest()[:16]

    @classmethod
    def from_file(cls, path: str | Path) -> WorkloadSpec:
        """Load a workload from YAML or JSON; errors name the bad field (a YAML key given twice, a boolean or a
        non-finite number where a number belongs: servetune.strict_yaml, servetune.numbers)."""
        from servetune.input_files import read_bytes
        from servetune.numbers import check_numbers
        from servetune.strict_yaml import load_yaml

        text = read_bytes(path).decode("utf-8")  # a FIFO named as the workload: refused, never read
        data = load_yaml(text) if str(path).endswith((".yaml", ".yml")) else orjson.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a workload file must hold a mapping, got {type(data).__name__}")
        return check_numbers(data, cls.model_validate(data))
