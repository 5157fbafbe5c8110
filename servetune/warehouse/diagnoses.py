"""The ``diagnoses`` rows of a trial: ``servetune.diagnose`` findings, written inside the trial's load.

Delete-then-insert per trial in the caller's transaction, so a reload (``--replace``) never leaves two
sets behind and a load that fails rolls the findings back with everything else. A rule that raises
on odd data costs the trial its findings, never its load: the failure is logged and one ``info`` row
says so.
"""

from __future__ import annotations

import logging

import orjson
from sqlalchemy import Connection, delete, insert

from servetune.result import TrialResult
from servetune.warehouse.tables import diagnoses

log = logging.getLogger(__name__)


def findings_rows(result: TrialResult) -> list[dict]:
    """The trial's findings as rows (evidence made plain JSON: numpy figures become numbers)."""
    from servetune.diagnose import Finding, diagnose_trial

    try:
        found = diagnose_trial(result)
    except Exception as exc:  # noqa: BLE001 - a diagnosis never fails a load
        log.warning("trial %s: diagnoses failed: %s: %s", result.trial_id, type(exc).__name__, exc)
        found = [Finding(trial_id=result.trial_id, kind="diagnose.error", severity="info",
                         summary=f"the diagnoses failed on this trial's data: {type(exc).__name__}: {exc}"[:500])]
    return [{"trial_id": result.trial_id, "seq": i, "kind": f.kind, "severity": f.severity, "summary": f.summary,
             "evidence": orjson.loads(orjson.dumps(f.evidence, option=orjson.OPT_SERIALIZE_NUMPY)),
             "advice": f.advice} for i, f in enumerate(found)]


def write(conn: Connection, result: TrialResult) -> int:
    """Replace the trial's findings (in ``conn``'s transaction); returns how many rows were written."""
    rows = findings_rows(result)
    conn.execute(delete(diagnoses).where(diagnoses.c.trial_id == result.trial_id))
    if rows:
        conn.execute(insert(diagnoses), rows)
    return len(rows)
