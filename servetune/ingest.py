"""Results into the warehouse, judged first: the report checklist (servetune.validation) runs on each
trial, then the warehouse (servetune.warehouse) stores it with its verdict. The two stay apart — the
warehouse never imports the checklist — and this is where they meet."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from servetune.result import TrialResult
from servetune.warehouse.loader import LoadReport, load_result as store


def load_result(engine_or_url: Engine | str | None, source: str | Path | TrialResult, *, validate: bool = True,
                replace: bool = False, **validate_kwargs: Any) -> LoadReport:
    """Load a campaign directory, a trial JSON or a ``TrialResult``, each trial judged by the checklist
    (``validate_kwargs`` go to ``servetune.validation.validate``) unless ``validate`` is False: then a
    trial keeps the verdict stored with it, if any."""
    checklist = None
    if validate:
        from servetune.validation import validate as run_checklist

        checklist = partial(run_checklist, **validate_kwargs)
    return store(engine_or_url, source, checklist=checklist, replace=replace)
