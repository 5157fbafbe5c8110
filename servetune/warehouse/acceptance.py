"""Accepted answers: a later run is compared with the last answer someone accepted, never with a regressed one.

A regression alerts once and then used to become the baseline: the next run, as slow, was compared with the
slow run and came out green. Now an answer becomes the baseline when it is accepted: by servetune itself when
it is the model's first or when it changed no flag or level and fell behind in nothing
(``diff_from_previous``), else by a person (``servetune accept EXPERIMENT --why ...``, which the weekly
DAG's approval step also runs). Until then every later run keeps comparing with the accepted one and stays
red on the same regression. Acceptances live in a table of their own (0016): reloading a campaign's folder
rewrites its experiment row and must never undo a decision.
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, exists, select
from sqlalchemy.dialects.postgresql import insert

from servetune.redact import redact_text
from servetune.warehouse import db
from servetune.warehouse.files import LoadError
from servetune.warehouse.tables import acceptances, experiments


def auto_accept(conn: Connection, experiment_id: str, model: str, status: str | None,
                recommendation: dict[str, Any] | None) -> str | None:
    """Accept a finished campaign's answer when no person needs to (returns why), else None: it awaits one."""
    if status != "done" or not recommendation:
        return None
    diff = recommendation.get("diff_from_previous") or {}
    accepted = select(acceptances.c.experiment_id).join(
        experiments, experiments.c.experiment_id == acceptances.c.experiment_id).where(
        experiments.c.model == model, experiments.c.experiment_id != experiment_id)
    if not conn.execute(select(exists(accepted))).scalar_one():
        why = f"the first answer for {model}"
    elif diff.get("against") and not diff.get("regressions") and diff.get("same_config") \
            and not _moved_levels(diff.get("figures") or {}):
        why = f"the same config and level as {diff['against'].get('experiment_id')}, behind in nothing"
    else:
        return None
    conn.execute(insert(acceptances).values(experiment_id=experiment_id, accepted_by="servetune (automatic)",
                                            reason=why, automatic=True).on_conflict_do_nothing())
    return why


def awaiting(status: str | None, recommendation: dict[str, Any] | None) -> str | None:
    """Why a loaded answer that servetune did not accept waits for a person (one line), or None when there is
    no answer to accept (a failed campaign) or it was accepted already."""
    if status != "done" or not recommendation:
        return None
    diff = recommendation.get("diff_from_previous") or {}
    against = (diff.get("against") or {}).get("experiment_id") or "the last accepted answer"
    if found := diff.get("regressions"):
        return f"it regressed against {against}: " + "; ".join(r.get("why", "?") for r in found)
    if not diff.get("same_config"):
        flags = (diff.get("config") or {}).items()
        return f"its flags differ from {against}'s: " + ", ".join(f"--{k} {v.get('old')} -> {v.get('new')}"
                                                                  for k, v in flags)
    return f"its {' and '.join(_moved_levels(diff.get('figures') or {})) or 'level'} differs from {against}'s"


def _moved_levels(figures: dict[str, Any]) -> list[str]:
    """The level figures (streams, rate) whose old and new values differ."""
    return [k for k in ("concurrency", "rate")
            if (figures.get(k) or {}).get("old") != (figures.get(k) or {}).get("new")]


@dataclass(frozen=True)
class Accepted:
    experiment_id: str
    model: str
    accepted_by: str
    reason: str


def accept(experiment_id: str, reason: str, *, by: str | None = None, database_url: str | None = None) -> Accepted:
    """A person accepts a campaign's answer as the baseline (again: the latest decision stands). Refused in one
    line (LoadError) when the experiment is unknown, not done, or has no recommendation."""
    if not reason.strip():
        raise LoadError("say why (--why): the next reader of the history sees it")
    from servetune.warehouse.migrate import check_schema  # alembic: imported only by the commands that write

    who = by or getpass.getuser()
    eng = db.engine(database_url)
    try:
        with eng.begin() as conn:
            check_schema(conn)  # a write: never into a warehouse behind, ahead of or foreign to this servetune
            rows = conn.execute(select(experiments.c.experiment_id, experiments.c.model, experiments.c.status,
                                       experiments.c.recommendation).where(
                experiments.c.experiment_id.startswith(experiment_id, autoescape=True))).all()
            if len(rows) != 1:
                raise LoadError(f"{experiment_id!r} names {len(rows)} experiments in the warehouse"
                                " (give more of its id)" if rows else f"no experiment {experiment_id!r}"
                                " in the warehouse (load its folder first)")
            row = rows[0]
            if row.status != "done" or not row.recommendation:
                raise LoadError(f"experiment {row.experiment_id} is {row.status} with no recommendation:"
                                " only an answer can be the baseline")
            values = {"accepted_by": who, "reason": redact_text(reason.strip())[:500], "automatic": False}
            stmt = insert(acceptances).values(experiment_id=row.experiment_id, **values)
            conn.execute(stmt.on_conflict_do_update(index_elements=["experiment_id"],
                                                    set_={**values, "accepted_at": stmt.excluded.accepted_at}))
    finally:
        eng.dispose()
    return Accepted(row.experiment_id, row.model, who, values["reason"])


__all__ = ["Accepted", "accept", "auto_accept", "awaiting"]
