"""The last accepted answer for the same service: what a weekly or on-change campaign is compared with.

Like for like is the same model, workload, SLA, load mode, engine kind and GPU. The newest such
experiment that concluded ``done`` with a recommendation is the comparison. Without one, the newest
accepted answer for the model is used, and ``changed`` names what differs ("workload", "sla", ...), so
a report never compares two different services without saying so. ``describe`` says it in words
("SLA changed: p99 TTFT 2000 -> 1500 ms"): ``servetune history`` draws a trend arrow only between runs
with no such change (servetune.report.history).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from servetune.plan import TuningPlan
from servetune.redact import redact
from servetune.warehouse import db
from servetune.warehouse.tables import acceptances, experiments

#: the parts of a plan that make two campaigns the same service, and how each is read from a stored plan
LIKE_FOR_LIKE = ("workload", "sla", "load", "engine kind", "gpu")


@dataclass
class PreviousAnswer:
    experiment_id: str
    started_at: str | None
    recommendation: dict[str, Any]
    changed: list[str] = field(default_factory=list)  # empty: like for like

    def as_previous(self) -> dict[str, Any]:
        """The recommendation as ``Campaign(previous=...)`` reads it, with where it came from."""
        return {**self.recommendation, "experiment_id": self.experiment_id, "started_at": self.started_at,
                "changed": self.changed}


def identity(plan: dict[str, Any]) -> dict[str, Any]:
    """The LIKE_FOR_LIKE parts of a stored plan (JSON as the warehouse keeps it)."""
    engine = plan.get("engine") or {}
    return {"workload": plan.get("workload"), "sla": plan.get("sla"),
            "load": (plan.get("load") or {}).get("mode", "concurrency"), "engine kind": engine.get("kind"),
            "gpu": engine.get("gpu_profile") or (plan.get("runner") or {}).get("gpu_type")}


def changes(old_plan: dict[str, Any], new_plan: dict[str, Any]) -> list[str]:
    """What makes the two plans different services (``LIKE_FOR_LIKE`` names), in that order."""
    old, new = identity(old_plan), identity(new_plan)
    return [k for k in LIKE_FOR_LIKE if old[k] != new[k]]


#: how each LIKE_FOR_LIKE part is named in a note, and the SLA bounds' names
_LABELS = {"workload": "workload", "sla": "SLA", "load": "load", "engine kind": "engine", "gpu": "GPU"}
_SLA_NAMES = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "e2e_ms": "E2E", "max_error_rate": "max error rate",
              "gpu_memory_limit": "GPU memory limit"}


def _value(v: Any) -> str:
    if v is None:
        return "unset"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _sla_change(old: dict[str, Any], new: dict[str, Any]) -> str:
    """``p99 TTFT 2000 -> 1500 ms, TPOT unset -> 50 ms``: each bound that differs."""
    parts = []
    for key in dict.fromkeys([*old, *new]):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        p99 = key.startswith("p99_")
        base = key.removeprefix("p99_")
        name = ("p99 " if p99 else "") + _SLA_NAMES.get(base, base)
        parts.append(f"{name} {_value(a)} -> {_value(b)}{' ms' if key.endswith('_ms') else ''}")
    return ", ".join(parts)


def _dict_change(old: dict[str, Any], new: dict[str, Any], most: int = 3) -> str:
    """The top-level keys that differ (``input_tokens 512 -> 1024`` where both are plain values)."""
    keys = [k for k in dict.fromkeys([*old, *new]) if old.get(k) != new.get(k)]
    plain = (str, int, float, bool, type(None))
    parts = [f"{k} {_value(old.get(k))} -> {_value(new.get(k))}"
             if isinstance(old.get(k), plain) and isinstance(new.get(k), plain) else str(k)
             for k in keys[:most]]
    return ", ".join(parts) + (", ..." if len(keys) > most else "")


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Two identities (``identity``'s keys) in words: a phrase per part that differs, in LIKE_FOR_LIKE order."""
    out = []
    for key in LIKE_FOR_LIKE:
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if isinstance(a, dict | None) and isinstance(b, dict | None):  # one of them a dict: None is {}
            detail = (_sla_change if key == "sla" else _dict_change)(a or {}, b or {})
        else:
            detail = f"{_value(a)} -> {_value(b)}"
        out.append(f"{_LABELS[key]} changed" + (f": {detail}" if detail else ""))
    return out


def describe(old_plan: dict[str, Any], new_plan: dict[str, Any]) -> list[str]:
    """``changes`` in words: ``["SLA changed: p99 TTFT 2000 -> 1500 ms", "workload changed: seed 1 -> 2"]``."""
    return differences(identity(old_plan), identity(new_plan))


def last_accepted(plan: TuningPlan, database_url: str | None = None, *,
                  exclude: str | None = None, scan: int = 50) -> PreviousAnswer | None:
    """The newest accepted answer of ``plan.model`` (servetune.warehouse.acceptance; not ``exclude``, the
    campaign itself), like for like first; None when the model has none. A regressed or changed answer
    nobody accepted is never the baseline."""
    query = (select(experiments.c.experiment_id, experiments.c.started_at, experiments.c.plan,
                    experiments.c.recommendation)
             .join(acceptances, acceptances.c.experiment_id == experiments.c.experiment_id)
             .where(experiments.c.model == plan.model, experiments.c.status == "done",
                    experiments.c.recommendation.is_not(None))
             .order_by(experiments.c.started_at.desc().nulls_last(), experiments.c.loaded_at.desc())
             .limit(scan))
    if exclude is not None:
        query = query.where(experiments.c.experiment_id != exclude)
    eng = db.engine(database_url)
    try:
        with eng.connect() as conn:
            rows = conn.execute(query).all()
    finally:
        eng.dispose()
    mine = redact(plan.model_dump(mode="json"))  # as stored
    found = [PreviousAnswer(r.experiment_id, r.started_at.isoformat() if r.started_at else None,
                            dict(r.recommendation), changes(r.plan or {}, mine)) for r in rows]
    return next((p for p in found if not p.changed), found[0] if found else None)


__all__ = ["LIKE_FOR_LIKE", "PreviousAnswer", "changes", "describe", "differences", "identity",
           "last_accepted"]
