"""Diagnoses: rules that read one trial (or a campaign) and say what held the server back, with the evidence.

Each rule family lives in its own module (memory, interference, prefix_cache, queue, batching, images,
graphs) as pure functions over ``servetune.result.TrialResult``; thresholds are module constants, documented in
docs/diagnoses.md. A finding states its figures (``evidence``) so a reader can check the verdict, and
the advice names the SGLang flag to move. ``summary`` turns a campaign's findings into the one-screen view
``servetune diagnose DIR`` prints first. No finding is ever a measurement of its own: every figure
comes from the trial's records, GPU samples, server telemetry, summary and workload spec.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from servetune.experiment import CAMPAIGN_FILES, ResultFolder
from servetune.records import RequestRecord
from servetune.result import TrialResult

Severity = Literal["info", "warning", "critical"]
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


class Finding(BaseModel):
    """One diagnosis of one trial: what was seen (summary, evidence figures) and what to try (advice)."""

    model_config = ConfigDict(extra="forbid")

    trial_id: str
    kind: str  # family.verdict, e.g. memory.sawtooth, prefix_cache.not_effective
    severity: Severity
    summary: str
    evidence: dict[str, Any] = Field(default_factory=dict)
    advice: str | None = None

    @property
    def family(self) -> str:
        return self.kind.split(".", 1)[0]


def diagnose_trial(result: TrialResult) -> list[Finding]:
    """Every rule over one trial, most severe first (a failed trial still gets what its data allows)."""
    from servetune.diagnose import graphs, images, interference, memory, prefix_cache, queue

    findings: list[Finding] = []
    for rule in (memory.diagnose, interference.diagnose, prefix_cache.diagnose, queue.diagnose, images.diagnose,
                 graphs.diagnose):
        findings.extend(rule(result))
    return sort_findings(findings)


def diagnose_trials(trials: Iterable[TrialResult]) -> list[Finding]:
    """Each trial's findings, then those comparing trials (waves against continuous batching at equal B)."""
    from servetune.diagnose import batching

    trials = list(trials)
    out = [f for t in trials for f in diagnose_trial(t)]
    return out + batching.compare(trials)


def diagnose_dir(path: str | Path) -> list[Finding]:
    """A trial JSON file, or a campaign folder (its ``trials/*.json``, else every ``*.json`` in it)."""
    return diagnose_trials(read_trials(path))


def read_trials(path: str | Path) -> list[TrialResult]:
    """The trials at ``path``: one result file, a campaign's ``trials/`` folder, or a folder of result files."""
    p = Path(path)
    if p.is_file():
        return [TrialResult.read(p)]
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: no such file or directory")
    folder = ResultFolder(p)
    files = folder.trial_files() if folder.trials_dir.is_dir() else sorted(p.glob("*.json"))
    files = [f for f in files if f.name not in CAMPAIGN_FILES]
    if not files:
        raise FileNotFoundError(f"{p}: no trial result in it (expected trials/*.json or *.json)")
    return [TrialResult.read(f) for f in files]


def sort_findings(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], f.kind))


def flag(result: TrialResult, name: str) -> Any:
    """A server flag as the trial ran it: the launch config (any spelling), else the server's resolved args."""
    want = name.lstrip("-").replace("-", "_")
    for source in (result.server_config or {}, (result.server or {}).get("server_info") or {}):
        for key, value in source.items():
            if isinstance(key, str) and key.lstrip("-").replace("-", "_") == want and value is not None:
                return value
    return None


def workload_spec(result: TrialResult) -> dict[str, Any]:
    """The workload spec the trial was built from (``result.workload["spec"]``), or {} when not kept."""
    spec = (result.workload or {}).get("spec")
    return spec if isinstance(spec, dict) else {}


def steady_set(result: TrialResult) -> tuple[list[RequestRecord], str]:
    """The requests the trial's summary figures cover, and their name for a reader.

    As ``servetune.metrics.summarize``: the successful measured requests that completed inside the
    steady window (an open loop's: that arrived inside it). A trial without a stored window (a
    synthetic or pre-window result) gives every successful measured request; so does an INVALID one,
    whose window is its whole span."""
    ok = [r for r in result.records if not r.warmup and r.ok]
    s = result.summary
    ws, we = s.window_start_s, s.window_end_s
    if ws is None or we is None:
        return ok, f"{every_measured(len(ok))} (warm-up left out)"
    if s.window_source == "no_steady_window":
        return ok, f"{every_measured(len(ok))} (no steady window: the trial is INVALID)"
    if s.window_source == "steady" and s.scenario == "open_loop":
        inside = [r for r in ok if ws <= r.t_send_s <= we]
        return inside, f"the {len(inside)} successful requests that arrived inside the {we - ws:.0f} s steady window"
    inside = [r for r in ok if r.e2e_ms is not None and ws < r.t_send_s + r.e2e_ms / 1000.0 <= we]
    timed = sum(r.ttft_ms is not None for r in ok)
    if s.ttft_ms.count and s.ttft_ms.count != sum(r.ttft_ms is not None for r in inside) and s.ttft_ms.count == timed:
        return ok, f"{every_measured(len(ok))} (the set this older result's summary used)"
    window = "waves window" if s.window_source == "waves" else "stated window" if s.window_source == "stated" \
        else "steady window"
    return inside, f"the {len(inside)} successful requests that completed inside the {we - ws:.0f} s {window}"


def every_measured(n: int) -> str:
    return "the only successful measured request" if n == 1 else f"all {n} successful measured requests"


def r3(x: float | None) -> float | None:
    """Evidence figures rounded for reading (3 decimals), None kept."""
    return None if x is None else round(float(x), 3)
