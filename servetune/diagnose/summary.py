"""A campaign's diagnoses at a glance: one row per trial in the order the campaign walked them, the
findings counted by severity and kind, and the few worth acting on with what to try.

Pure data over ``TrialResult`` and ``Finding`` (``servetune diagnose`` renders it, docs/diagnoses.md).
Rows go by stage (protocol, correctness, baseline, ramp, bisect, refine, robustness; a lone bench
trial last), then level, then creation time: never by trial id. With more than ``GROUP_OVER`` trials
a row is one (stage, level, config) group.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from servetune.checklist_report import plain_words
from servetune.diagnose import SEVERITY_ORDER, Finding
from servetune.result import ALL_STAGES, TrialResult

STAGE_ORDER: dict[str | None, int] = {s: i for i, s in enumerate(ALL_STAGES)}
GROUP_OVER = 24  # more trials than this: one row per (stage, level, config) group
TOP = 3  # the kinds worth acting on shown with their advice under the table (the rest named)
NOTES = 4  # rejected / failed / INVALID trials whose reason is given under the table


@dataclass
class Row:
    """One trial, or one (stage, level, config) group of trials."""

    trial_ids: list[str]
    stage: str
    load: str  # "48" (streams), "64 waves", "2.5 req/s"
    config: str  # the flags that differ from what every trial shares ("base": none)
    status: str  # accepted | rejected | failed | INVALID | passed (correctness); a group: "2 accepted, 1 INVALID"
    goodput_rps: float | None  # over the steady window; None without one (a group: the mean)
    worst: Finding | None  # most severe finding worth acting on (warning or critical, or with advice)
    recommended: bool = False  # the recommendation's config at its level
    evidence: bool = True  # accepted (a group: all of it); else the figure is shown but is no evidence


@dataclass
class Top:
    """One kind of finding worth acting on, over the campaign."""

    kind: str
    severity: str
    trials: int
    example: Finding  # the most severe instance; among equals an accepted trial's, the first in campaign order
    where: str  # the example's trial: "8cb5babe (ramp, 64 streams)"


@dataclass
class CampaignSummary:
    title: str
    rows: list[Row]
    grouped: bool
    statuses: dict[str, int]
    counts: dict[str, dict[str, int]]  # severity -> kind -> findings
    top: list[Top]
    more: list[str] = field(default_factory=list)  # the other kinds worth acting on, most severe first
    notes: list[str] = field(default_factory=list)  # why a trial was rejected, failed or INVALID
    recommendation: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The summary as plain data (``--json`` keeps the findings array; this is for a library caller)."""
        return {"title": self.title, "grouped": self.grouped, "statuses": self.statuses, "counts": self.counts,
                "recommendation": self.recommendation, "notes": self.notes,
                "rows": [{"trial_ids": r.trial_ids, "stage": r.stage, "load": r.load, "config": r.config,
                          "status": r.status, "goodput_rps": r.goodput_rps, "recommended": r.recommended,
                          "worst": None if r.worst is None else f"{r.worst.severity} {r.worst.kind}"}
                         for r in self.rows],
                "top": [{"kind": t.kind, "severity": t.severity, "trials": t.trials, "where": t.where,
                         "summary": t.example.summary, "advice": t.example.advice} for t in self.top],
                "more": self.more}


def level(t: TrialResult) -> float | None:
    """Streams of a closed loop (or a wave's size), offered requests/s of an open one."""
    value = t.load.get("rate") if t.load.get("mode") == "rate" else t.load.get("concurrency")
    return float(value) if isinstance(value, int | float) else None


def ordered(trials: list[TrialResult]) -> list[TrialResult]:
    """Stage order, then level, then creation time."""
    return sorted(trials, key=lambda t: (STAGE_ORDER.get(t.stage, len(ALL_STAGES)), level(t) or 0.0, t.created_at))


def load_label(t: TrialResult) -> str:
    """``48`` (streams in flight), ``64 waves`` (static batches of 64), ``2.5 req/s``; ``-`` without a level."""
    n = level(t)
    if n is None:
        return "-"
    mode = t.load.get("mode")
    return f"{n:g} req/s" if mode == "rate" else f"{n:g} waves" if mode == "waves" else f"{n:g}"


def status(t: TrialResult) -> str:
    """accepted, rejected (the checklist failed it), failed, INVALID (no steady window), passed (correctness)."""
    if t.status in ("failed", "rejected"):
        return t.status
    if t.stage == "correctness":  # one request: a check that the server answers, never a steady measurement
        return "passed"
    return "INVALID" if t.summary.valid is False else "accepted"


def _value(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _flags(config: dict[str, Any] | None) -> dict[str, Any]:
    return {k.lstrip("-"): v for k, v in (config or {}).items()}


def shared_flags(trials: list[TrialResult]) -> dict[str, Any]:
    """The flags every trial ran with the same value ({} for a lone trial: all its flags are its own)."""
    configs = [_flags(t.server_config) for t in trials]
    shared = dict(configs[0]) if len(configs) > 1 else {}
    for c in configs[1:]:
        shared = {k: v for k, v in shared.items() if k in c and c[k] == v}
    return shared


def config_label(config: dict[str, Any] | None, shared: dict[str, Any]) -> str:
    """The flags of ``config`` that differ from the shared ones, "" when none does."""
    return ", ".join(f"{k}={_value(v)}" for k, v in sorted(_flags(config).items()) if shared.get(k, ...) != v)


def config_labels(trials: list[TrialResult]) -> dict[str, str]:
    """Each trial's flags less those every trial shares with the same value ("base" when nothing is left);
    a protocol trial is named by its protocol."""
    shared = shared_flags(trials)
    out = {}
    for t in trials:
        diff = config_label(t.server_config, shared)
        name = (t.load.get("protocol") or {}).get("name") if isinstance(t.load.get("protocol"), dict) else None
        out[t.trial_id] = ": ".join(x for x in (name, diff or (None if name else "base")) if x)
    return out


def actionable(f: Finding) -> bool:
    """A warning or a critical, or an info finding that says what to try."""
    return f.severity != "info" or bool(f.advice)


def _rank(f: Finding) -> tuple[int, bool, str]:
    return SEVERITY_ORDER[f.severity], not f.advice, f.kind


def worst(findings: list[Finding], spread: dict[str, int] | None = None) -> Finding | None:
    """The most severe finding worth acting on; among equals the one with advice, then the kind found in
    the fewest trials (``spread``: what sets this trial apart, e.g. a cap reached under a common sawtooth)."""
    spread = spread or {}
    found = sorted((f for f in findings if actionable(f)),
                   key=lambda f: (SEVERITY_ORDER[f.severity], not f.advice, spread.get(f.kind, 0), f.kind))
    return found[0] if found else None


def _recommended(t: TrialResult, rec: dict[str, Any] | None) -> bool:
    if not rec or t.status != "ok":
        return False
    want = rec.get("rate") if rec.get("rate") is not None else rec.get("concurrency")
    mode_ok = (t.load.get("mode") == "rate") == (rec.get("rate") is not None)
    return mode_ok and level(t) == want and _flags(t.server_config) == _flags(rec.get("config"))


def _goodput(t: TrialResult) -> float | None:
    return None if t.summary.window_source == "no_steady_window" else t.summary.goodput_rps


def summarize(trials: list[TrialResult], findings: list[Finding], *, experiment: dict[str, Any] | None = None,
              recommendation: dict[str, Any] | None = None) -> CampaignSummary:
    """The campaign's rows (per trial, or per group past ``GROUP_OVER`` trials), counts, top findings, notes."""
    trials = ordered(trials)
    by_trial: dict[str, list[Finding]] = {}
    for f in findings:
        by_trial.setdefault(f.trial_id, []).append(f)
    labels = config_labels(trials)
    grouped = len(trials) > GROUP_OVER
    groups: dict[tuple[str, str, str], list[TrialResult]] = {}
    for t in trials:
        key = (t.stage or "bench", load_label(t), labels[t.trial_id])
        groups.setdefault(key if grouped else (*key, t.trial_id), []).append(t)  # type: ignore[arg-type]
    spread = Counter(kind for _, kind in {(f.trial_id, f.kind) for f in findings})
    rows = []
    for (stage, load, config, *_), ts in groups.items():
        stat = Counter(status(t) for t in ts)
        goodputs = [g for t in ts if (g := _goodput(t)) is not None]
        rows.append(Row(trial_ids=[t.trial_id for t in ts], stage=stage, load=load, config=config,
                        status=", ".join(f"{n} {s}" for s, n in stat.most_common()) if grouped else status(ts[0]),
                        goodput_rps=sum(goodputs) / len(goodputs) if goodputs else None,
                        evidence=all(status(t) == "accepted" for t in ts),
                        worst=worst([f for t in ts for f in by_trial.get(t.trial_id, [])], spread),
                        recommended=any(_recommended(t, recommendation) for t in ts)))
    counts: dict[str, dict[str, int]] = {}
    for sev in SEVERITY_ORDER:
        kinds = Counter(f.kind for f in findings if f.severity == sev)
        counts[sev] = dict(sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))
    top = _top(trials, findings)
    return CampaignSummary(title=_title(trials, experiment), rows=rows, grouped=grouped,
                           statuses=dict(Counter(status(t) for t in trials)), counts=counts,
                           top=top[:TOP], more=[f"{t.severity} {t.kind}" for t in top[TOP:]], notes=_notes(trials),
                           recommendation=_recommendation(recommendation, shared_flags(trials)))


def _where(t: TrialResult) -> str:
    load = load_label(t)
    return f"{t.trial_id[:8]} ({t.stage or 'bench'}, {load + ' streams' if load.isdigit() else load})"


def _top(trials: list[TrialResult], findings: list[Finding]) -> list[Top]:
    pos = {t.trial_id: i for i, t in enumerate(trials)}
    by_id = {t.trial_id: t for t in trials}
    kinds: dict[str, list[Finding]] = {}
    # the example: the most severe instance, from an accepted trial where there is one, the first in campaign order
    accepted = {t.trial_id for t in trials if status(t) == "accepted"}
    for f in sorted((f for f in findings if actionable(f)),
                    key=lambda f: (_rank(f), f.trial_id not in accepted, pos.get(f.trial_id, len(pos)))):
        kinds.setdefault(f.kind, []).append(f)
    out = [Top(kind=k, severity=fs[0].severity, trials=len({f.trial_id for f in fs}), example=fs[0],
               where=_where(by_id[fs[0].trial_id]) if fs[0].trial_id in by_id else fs[0].trial_id[:8])
           for k, fs in kinds.items()]
    out.sort(key=lambda t: (SEVERITY_ORDER[t.severity], not t.example.advice, -t.trials, t.kind))
    return out


def _notes(trials: list[TrialResult]) -> list[str]:
    out = []
    for t in trials:
        s = status(t)
        if s == "rejected" and (items := failed_items(t)):
            out.append(f"{_where(t)} rejected: {'; '.join(plain_words(failed_pairs(t)))}"
                       f" (checklist: {', '.join(items)})")
        elif s in ("rejected", "failed"):
            out.append(f"{_where(t)} {s}: {t.failure_reason or 'no reason recorded'}")
        elif s == "INVALID":
            out.append(f"{_where(t)} INVALID: {'; '.join(t.summary.invalid_reasons) or 'no reason recorded'}")
    if len(out) > NOTES:
        out = [*out[:NOTES], f"... and {len(out) - NOTES} more (--all)"]
    return out


def failed_pairs(t: TrialResult) -> list[tuple[str | None, str | None]]:
    """(checklist item, column) of each expectation the trial failed."""
    return [(r.get("checklist"), r.get("column")) for r in (t.validation or {}).get("results") or []
            if isinstance(r, dict) and r.get("success") is False]


def failed_items(t: TrialResult) -> list[str]:
    """The checklist items a trial failed, with the column each read: ``steady_window (window_source)``."""
    out = []
    for r in (t.validation or {}).get("results") or []:
        if isinstance(r, dict) and r.get("success") is False:
            item = str(r.get("checklist") or r.get("suite") or r.get("expectation"))
            out.append(f"{item} ({r['column']})" if r.get("column") else item)
    return list(dict.fromkeys(out))


def _title(trials: list[TrialResult], experiment: dict[str, Any] | None) -> str:
    exp = experiment or {}
    eid = exp.get("experiment_id") or next((t.experiment_id for t in trials if t.experiment_id), None)
    target = next((t.target for t in trials if t.target), {}) or {}
    model = exp.get("model") or target.get("model")
    engine = exp.get("engine") or target.get("engine")
    gpu = target.get("gpu_profile")
    what = " on ".join(str(x) for x in (model, engine) if x) + (f" ({gpu})" if gpu else "")
    head = f"campaign {eid}" if eid else "trials"
    return f"{head}: {what}" if what else head


def _recommendation(rec: dict[str, Any] | None, shared: dict[str, Any]) -> str | None:
    if not rec:
        return None
    config = config_label(rec.get("config"), shared) or "the base config"
    at = f"{rec['rate']:g} req/s" if rec.get("rate") is not None else (
        f"{rec['concurrency']:g} streams" if isinstance(rec.get("concurrency"), int | float) else "-")
    good = rec.get("goodput_rps")
    return f"{config} at {at}" + (f", goodput {good:.2f} req/s" if isinstance(good, int | float) else "")
