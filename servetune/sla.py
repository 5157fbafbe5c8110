"""Service-level bounds a request must meet to count towards goodput."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SLA(BaseModel):
    """Per-request latency bounds (ms) plus trial-level limits.

    A request is "good" when it succeeded and met every latency bound that is set.
    The percentile bounds (``p99_*``) judge the trial as a whole in tuning.
    """

    model_config = ConfigDict(extra="forbid")

    ttft_ms: float | None = Field(default=None, gt=0, description="per-request TTFT bound")
    tpot_ms: float | None = Field(default=None, gt=0, description="per-request TPOT bound")
    e2e_ms: float | None = Field(default=None, gt=0, description="per-request E2E bound")
    p99_ttft_ms: float | None = Field(default=None, gt=0)
    p99_tpot_ms: float | None = Field(default=None, gt=0)
    p99_e2e_ms: float | None = Field(default=None, gt=0)
    max_error_rate: float = Field(default=0.01, ge=0, le=1)
    gpu_memory_limit: float | None = Field(default=None, gt=0, le=1, description="peak used/total")

    def request_bounds(self) -> dict[str, float]:
        """The per-request bounds used for goodput; the p99 bounds stand in when unset."""
        out: dict[str, float] = {}
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            v = getattr(self, name)
            if v is None:
                v = getattr(self, f"p99_{name}")
            if v is not None:
                out[name] = float(v)
        return out

    @classmethod
    def parse_cli(cls, items: list[str]) -> SLA:
        """``["ttft_ms=500", "tpot_ms=50"]`` -> SLA (CLI ``--sla``)."""
        data: dict[str, float] = {}
        for item in items:
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"--sla expects key=value, got {item!r}")
            data[key.strip().replace("-", "_")] = float(value)
        return cls.model_validate(data)
