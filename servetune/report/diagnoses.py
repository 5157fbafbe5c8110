"""The report's "Diagnoses" section: ``servetune.diagnose`` findings of the campaign's trials.

Warnings and critical findings are listed first with their advice; the info findings (the shapes and
audits that found nothing wrong) follow, folded, so a clean campaign's section stays short.
"""

from __future__ import annotations

from typing import Any

from servetune.report.campaign import CampaignView, level_of


def diagnosis_rows(campaign: CampaignView) -> dict[str, Any]:
    """{"flagged": rows of warning/critical findings, "info": the rest, "error": why none were computed}."""
    from servetune.diagnose import diagnose_trials, sort_findings

    try:
        findings = sort_findings(diagnose_trials(campaign.trials))
    except Exception as exc:  # noqa: BLE001 - a report is drawn whatever a rule thinks of odd data
        return {"flagged": [], "info": [], "error": f"{type(exc).__name__}: {exc}"}
    by_id = {t.trial_id: t for t in campaign.trials}
    rows = []
    for f in findings:
        t = by_id.get(f.trial_id)
        rows.append({"trial_id": f.trial_id, "stage": (t.stage if t else None) or "bench",
                     "level": "-" if t is None or level_of(t) is None else f"{level_of(t):g}",
                     "severity": f.severity, "kind": f.kind, "summary": f.summary, "advice": f.advice or "",
                     "css": {"critical": "bad", "warning": "bad", "info": "muted"}[f.severity]})
    return {"flagged": [r for r in rows if r["severity"] != "info"],
            "info": [r for r in rows if r["severity"] == "info"], "error": None}
