"""Did this answer fall behind the last accepted one? Regression rules, with thresholds from the noise.

Each rule reads one figure of the two recommendations: goodput at the SLA, the capacity (rate mode:
requests/s; closed loop: the ceiling's streams), p99 TTFT and p99 TPOT, the prefix-cache hit rate. A
figure regresses when it moved the bad way by more than its threshold: twice the noise of a difference
of the two campaigns' goodputs (``2 x sqrt(cv_old^2 + cv_new^2)``, each CV measured on that campaign's
own seeds: about a 95% bound), never under the rule's floor (a campaign of one seed has no CV). Hit rate
is compared in points. Two answers for different services (a changed workload, SLA, load mode, engine
or GPU: ``changed``) are shown side by side but never called a regression.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

K_NOISE = 2.0  # noise multiples a move must exceed


@dataclass(frozen=True)
class Rule:
    figure: str
    higher_is_better: bool
    floor: float  # the smallest threshold: relative, or points for the hit rate
    points: bool = False  # compared as an absolute difference (a fraction's points), not relative


RULES = (
    Rule("goodput_rps", True, 0.05),
    Rule("capacity", True, 0.05),
    Rule("p99_ttft_ms", False, 0.10),
    Rule("p99_tpot_ms", False, 0.10),
    Rule("prefix_hit_rate", True, 0.05, points=True),
)


def _capacity(rec: dict[str, Any]) -> float | None:
    return rec.get("rate") if rec.get("rate") is not None else rec.get("concurrency")


def noise(previous: dict[str, Any], current: dict[str, Any]) -> float:
    """The relative noise of a goodput difference between the two campaigns (0 when neither measured it)."""
    cvs = [cv for cv in (previous.get("goodput_cv"), current.get("goodput_cv")) if isinstance(cv, int | float)]
    return math.sqrt(sum(cv * cv for cv in cvs))


def regressions(previous: dict[str, Any], current: dict[str, Any]) -> list[dict[str, Any]]:
    """The figures of ``current`` (a recommendation as JSON) that fell behind ``previous`` beyond their
    threshold; empty when they are for different services (``previous["changed"]``) or none fell."""
    if previous.get("changed"):
        return []
    if (previous.get("rate") is None) != (current.get("rate") is None):
        return []  # a capacity in req/s against a ceiling in streams: not one figure
    spread = K_NOISE * noise(previous, current)
    out: list[dict[str, Any]] = []
    for rule in RULES:
        old = _capacity(previous) if rule.figure == "capacity" else previous.get(rule.figure)
        new = _capacity(current) if rule.figure == "capacity" else current.get(rule.figure)
        if not isinstance(old, int | float) or not isinstance(new, int | float) or (not old and not rule.points):
            continue
        move = (new - old) if rule.points else (new / old - 1)
        worse = -move if rule.higher_is_better else move
        threshold = rule.floor if rule.points else max(rule.floor, spread)
        if worse > threshold:
            unit = "points" if rule.points else "relative"
            out.append({"figure": rule.figure, "old": old, "new": new, "change": move, "threshold": threshold,
                        "unit": unit,
                        "why": f"{rule.figure} {old:.4g} -> {new:.4g} ({_fmt(move, rule.points)}, beyond the"
                               f" {_fmt(threshold, rule.points, signed=False)} threshold)"})
    return out


def _fmt(x: float, points: bool, *, signed: bool = True) -> str:
    if points:
        return f"{100 * x:{'+' if signed else ''}.1f} points"
    return f"{x:{'+' if signed else ''}.1%}"


__all__ = ["K_NOISE", "RULES", "Rule", "noise", "regressions"]
