"""The checklist's verdict on a trial, written into it: one place for the campaign (which checks each trial as
soon as it finishes, before any decision reads it), the ``validate`` task and ``servetune validate DIR``."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from servetune.experiment import ResultFolder
from servetune.plan import TuningPlan
from servetune.result import TrialResult
from servetune.validation.checklist import stored_report, validate

log = logging.getLogger(__name__)


def apply_checklist(result: TrialResult, *, min_measured: int = 200, waive: Iterable[str] = ()) -> TrialResult:
    """Run the checklist on ``result`` and keep its report in it: status ``rejected`` (with the failed items as
    the reason) or ``ok``; a report already stored from the same suites and parameters is reused. A trial
    that failed to run keeps status ``failed`` (the checklist explains nothing more about it); a correctness
    check is judged as one (``validate``: its own floor, no window items)."""
    if result.status == "failed":
        return result
    waive = list(waive)
    report = stored_report(result, min_measured=min_measured, waive=waive)
    if report is None:
        report = validate(result, min_measured=min_measured, waive=waive)
    result.validation = report.model_dump(mode="json")
    result.status = "ok" if report.success else "rejected"
    result.failure_reason = None if report.success else report.failure_reason()
    return result


def check_trial(plan: TuningPlan, result: TrialResult) -> TrialResult:
    """The report checklist on a trial the moment it finishes, before any decision reads it: a rejected trial
    (status ``rejected``, its failed items as the reason) is kept and shown but is never evidence; the
    ``validate`` task and the warehouse give it the same verdict (the same function, suites and parameters).
    A checklist that cannot run rejects the trial, saying why, rather than letting it decide unchecked."""
    try:
        return apply_checklist(result, min_measured=plan.validation.min_measured, waive=plan.validation.waive)
    except Exception as exc:  # noqa: BLE001 - a broken check must not pass a trial
        log.exception("checklist on trial %s", result.trial_id)
        result.status, result.failure_reason = "rejected", f"checklist could not run: {type(exc).__name__}: {exc}"
        return result


def validate_campaign(out_dir: str | Path, *, min_measured: int = 200, waive: Iterable[str] = ()) -> dict[str, int]:
    """Run the checklist on each ``trials/*.json``, store the report in the file, count the verdicts; the same
    verdict the campaign gave each trial when it ran (``apply_checklist``, the same suites and parameters)."""
    counts = {"accepted": 0, "rejected": 0, "failed": 0}
    waive = list(waive)
    for path in ResultFolder(out_dir).trial_files():
        result = apply_checklist(TrialResult.read(path), min_measured=min_measured, waive=waive)
        if result.status == "failed":
            counts["failed"] += 1
            continue
        result.save(path)
        counts["accepted" if result.status == "ok" else "rejected"] += 1
    return counts
