"""What the report shows about validity and repeats: per-level means over VALID repeats, per-trial cells.

An INVALID trial decides nothing in the tuner, so the report must not let it move a curve or a
ceiling either; it is still shown (hollow in the figures, its reasons in the tables) so a reader
sees what was measured and why it was set aside. Repeats of one level are pooled as the tuner
pools them: the mean with a Student-t 95% interval (servetune.stats.spread).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from servetune.report.campaign import CampaignView, counts, is_invalid, level_of, marginal_levels
from servetune.result import TrialResult, TrialSummary
from servetune.stats import Spread, spread

Getter = Callable[[TrialSummary], float | None]


@dataclass
class Level:
    """One level of the main config's curve (streams, or req/s offered): the trials that count and the INVALID ones."""

    concurrency: int | float
    used: list[TrialResult] = field(default_factory=list)
    invalid: list[TrialResult] = field(default_factory=list)

    def spread(self, get: Getter) -> Spread:
        return spread([get(t.summary) for t in self.used])


def curve_levels(campaign: CampaignView) -> list[Level]:
    """The main config's curve grouped by concurrency, sorted; failed trials (no figures) left out."""
    levels: dict[int, Level] = {}
    for t in campaign.main_curve():
        c = level_of(t)
        assert c is not None  # curve trials all have one
        level = levels.setdefault(c, Level(c))
        if counts(t):
            level.used.append(t)
        elif is_invalid(t):
            level.invalid.append(t)
    return [levels[c] for c in sorted(levels)]


@dataclass
class Series:
    """One plotted line: x, mean, CI half-widths (0 where unknown), and the INVALID points beside it."""

    xs: list[int]
    means: list[float]
    ci95: list[float]
    invalid_xs: list[int]
    invalid_ys: list[float]

    @property
    def any_interval(self) -> bool:
        return any(v > 0 for v in self.ci95)


def series(levels: list[Level], get: Getter) -> Series:
    """Means over each level's counted repeats (levels without any are skipped) and the INVALID values."""
    xs, means, cis, ixs, iys = [], [], [], [], []
    for level in levels:
        sp = level.spread(get)
        if sp.mean is not None:
            xs.append(level.concurrency)
            means.append(sp.mean)
            cis.append(sp.ci95 or 0.0)
        for t in level.invalid:
            value = get(t.summary)
            if value is not None:
                ixs.append(level.concurrency)
                iys.append(value)
    return Series(xs, means, cis, ixs, iys)


def validity_cells(t: TrialResult) -> dict[str, str]:
    """VALID / INVALID / '-' (legacy), the steady window, completions vs needed and the in-flight level."""
    s = t.summary
    if s.valid is None:
        window = "-" if s.window_s is None else f"{s.window_s:.1f} s"
        return {"validity": "-", "validity_class": "muted", "window": window, "completions": "-",
                "completions_class": "", "in_flight": "-", "reasons": ""}
    if s.window_source == "no_steady_window" or s.window_s is None:
        window = "no steady window"
    else:
        window = f"{s.window_s:.1f} s" + (" (stated)" if s.window_source == "stated" else "")
    short = s.completions_needed and s.completions_in_window < s.completions_needed
    return {
        "validity": "VALID" if s.valid else "INVALID", "validity_class": "ok" if s.valid else "bad",
        "window": window, "completions": f"{s.completions_in_window:,} / {s.completions_needed:,}",
        "completions_class": "bad" if short else "", "in_flight": _in_flight(t),
        "reasons": "; ".join(s.invalid_reasons),
    }


def _in_flight(t: TrialResult) -> str:
    """Closed loop: mean / lowest of the target streams; open loop: the dispatch fraction (and sustained)."""
    s = t.summary
    open_loop = s.scenario == "open_loop" or (s.scenario is None and t.load.get("mode") == "rate")
    if open_loop:
        if s.dispatch_fraction is None:
            return "-"
        kept = {True: ", sustained", False: ", not sustained", None: ""}[s.sustained]
        return f"dispatch {s.dispatch_fraction:.0%}{kept}"
    if s.in_flight_mean is None:
        return "-"
    lowest = "-" if s.in_flight_min is None else f"{s.in_flight_min:.1f}"
    target = "" if s.in_flight_target is None else f" of {s.in_flight_target:g}"
    return f"{s.in_flight_mean:.1f} / {lowest}{target}"


def goodput_text(rec: dict[str, Any]) -> str:
    """'8.60 ± 0.21 req/s (95% CI, n=3, CV 1.2%)'; without an interval, says there is none and why."""
    goodput = rec.get("goodput_rps")
    if not isinstance(goodput, int | float):
        return "-"
    n = int(rec.get("repeats") or 1)
    ci, cv = rec.get("goodput_ci95"), rec.get("goodput_cv")
    if isinstance(ci, int | float):
        cv_text = f", CV {cv:.1%}" if isinstance(cv, int | float) else ""
        return f"{goodput:,.2f} ± {ci:,.2f} req/s (95% CI, n={n}{cv_text})"
    why = "one trial, no interval" if n < 2 else "no interval stated"
    return f"{goodput:,.2f} req/s (n={n}: {why})"


def marginal(campaign: CampaignView) -> tuple[list[int], str]:
    """Levels whose SLA verdict flipped between repeats: as stated by the experiment, else from the trials."""
    stated = campaign.ceiling_info().get("marginal")
    if isinstance(stated, list):
        return sorted(int(c) for c in stated if isinstance(c, int | float)), "experiment.ceiling"
    return marginal_levels(campaign.main_curve(), campaign.sla), "derived from the repeats"


def ceiling_evidence(campaign: CampaignView) -> dict[str, Any]:
    """Marginal levels and the trial ids the stated ceiling rests on, for the recommendation section."""
    info = campaign.ceiling_info()
    levels, source = marginal(campaign)
    return {"marginal": levels, "marginal_source": source,
            "pass_ids": [str(x) for x in info.get("pass_trial_ids") or []],
            "fail_ids": [str(x) for x in info.get("fail_trial_ids") or []]}


def failed_checks(t: TrialResult) -> list[str]:
    """Each failed checklist expectation as a reader needs it: the item, the column and what it saw."""
    out = []
    for r in (t.validation or {}).get("results") or []:
        if not isinstance(r, dict) or r.get("success") is not False:
            continue
        observed, details = r.get("observed_value"), r.get("details") or {}
        if isinstance(observed, dict):
            seen = (observed.get("partial_unexpected_list") or [None])[0]
        else:
            seen = observed
        want = (f"not in {', '.join(map(str, details['value_set']))}" if "value_set" in details else
                f"< {details['min_value']}" if isinstance(details.get("min_value"), int | float) else "")
        shown = "" if seen is None else f"= {seen:.4g}" if isinstance(seen, float) else f"= {seen!r}"
        column = str(r.get("column") or "")
        if shown or want:
            what = " ".join(x for x in (column, shown, want) if x)
        else:  # nothing observed to show: the expectation says what was asked
            what = f"{r.get('expectation')}({column})" if column else str(r.get("expectation"))
        out.append(f"{r.get('checklist') or r.get('suite')}: {what}")
    return sorted(dict.fromkeys(out))
