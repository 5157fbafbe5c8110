"""Validate every trial of a campaign folder in place, keeping failures (status ``rejected``)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from servetune.experiment import ResultFolder
from servetune.result import TrialResult
from servetune.validation.checklist import validate


def validate_campaign(out_dir: str | Path, *, min_measured: int = 200, waive: Iterable[str] = ()) -> dict[str, int]:
    """Run the checklist on each ``trials/*.json``, store the report in the file, count the verdicts.

    Trials that failed to run keep status ``failed`` (the checklist explains nothing more about them);
    a correctness check is judged as one (``validate``: its own floor, no window items).
    """
    counts = {"accepted": 0, "rejected": 0, "failed": 0}
    for path in ResultFolder(out_dir).trial_files():
        result = TrialResult.read(path)
        if result.status == "failed":
            counts["failed"] += 1
            continue
        report = validate(result, min_measured=min_measured, waive=list(waive))
        result.validation = report.model_dump(mode="json")
        result.status = "ok" if report.success else "rejected"
        result.failure_reason = None if report.success else report.failure_reason()
        result.save(path)
        counts["accepted" if report.success else "rejected"] += 1
    return counts
