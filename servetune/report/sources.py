"""Where a report's campaign comes from: a result folder, a JSON file, or the warehouse by experiment id
(kept apart from servetune.report.campaign, which the warehouse source builds on)."""

from __future__ import annotations

from pathlib import Path

from servetune.oserrors import why_not_there
from servetune.report.campaign import CampaignView, ReportInputError, load_json, load_result_dir


def load_campaign(source: str, *, database_url: str | None = None) -> CampaignView:
    """A result directory, a JSON file, or an experiment id looked up in the warehouse."""
    path = Path(source)
    if path.is_dir():
        return load_result_dir(path)
    if path.is_file():
        return load_json(path)
    if path.suffix == ".json" or "/" in source:
        raise ReportInputError(f"{source}: {why_not_there(path)}")
    from servetune.report.warehouse_source import load_experiment

    return load_experiment(source, database_url=database_url)
