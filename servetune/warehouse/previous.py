"""The last accepted answer for the same service: what a weekly or on-change campaign is compared with.

Like for like is the same model, workload, SLA, load mode, engine kind and GPU. The newest such
experiment that concluded ``done`` with a recommendation is the comparison. Without one, the newest
accepted answer for the model is used, and ``changed`` names what differs ("workload", "sla", ...), so
a report never compares two different services without saying so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from servetune.plan import TuningPlan
from servetune.redact import redact
from servetune.warehouse import db
from servetune.warehouse.tables import experiments

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


def _identity(plan: dict[str, Any]) -> dict[str, Any]:
    engine = plan.get("engine") or {}
    return {"workload": plan.get("workload"), "sla": plan.get("sla"),
            "load": (plan.get("load") or {}).get("mode", "concurrency"), "engine kind": engine.get("kind"),
            "gpu": engine.get("gpu_profile") or (plan.get("runner") or {}).get("gpu_type")}


def changes(old_plan: dict[str, Any], new_plan: dict[str, Any]) -> list[str]:
    """What makes the two plans different services (``LIKE_FOR_LIKE`` names), in that order."""
    old, new = _identity(old_plan), _identity(new_plan)
    return [k for k in LIKE_FOR_LIKE if old[k] != new[k]]


def last_accepted(plan: TuningPlan, database_url: str | None = None, *,
                  exclude: str | None = None, scan: int = 50) -> PreviousAnswer | None:
    """The newest ``done`` experiment of ``plan.model`` with a recommendation (not ``exclude``, the campaign
    itself), like for like first; None when the model has none."""
    query = (select(experiments.c.experiment_id, experiments.c.started_at, experiments.c.plan,
                    experiments.c.recommendation)
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


__all__ = ["LIKE_FOR_LIKE", "PreviousAnswer", "changes", "last_accepted"]
