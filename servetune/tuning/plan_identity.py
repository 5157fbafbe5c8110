"""Which plan a campaign answers: its digest (a resumed campaign must run the same plan) and the
fingerprints of its model and prompt template (a weekly run is compared with runs of the same ones)."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import orjson

from servetune.plan import TuningPlan

log = logging.getLogger(__name__)


def plan_fingerprints(plan: TuningPlan) -> tuple[str | None, str | None]:
    """Model and prompt-template fingerprints (servetune.fingerprint), None where not computable (said in the log)."""
    from servetune.fingerprint import model_fingerprint, prompt_template_fingerprint

    try:
        model_fp: str | None = model_fingerprint(plan.model).digest
    except (OSError, ValueError) as exc:
        log.warning("model fingerprint of %s: %s", plan.model, exc)
        model_fp = None
    source = plan.prompt_template or (plan.model if Path(plan.model).is_dir() else None)
    template_fp: str | None = None
    if source is not None:
        try:
            template_fp = prompt_template_fingerprint(source).digest
        except (OSError, ValueError) as exc:
            log.warning("prompt template fingerprint of %s: %s", source, exc)
    return model_fp, template_fp


#: plan fields added after campaigns were first kept: (path..., name, default)
ADDED_SINCE_KEPT = (("load", None), ("robustness", None), ("stages", "baseline", "rate", None),
                    ("validation", "max_latency_growth", 1.5), ("validation", "max_client_lag_ms", 25.0),
                    ("repeats", "clear_margin", None), ("budget", "warmup_after_start", None),
                    ("stages", "ramp", "rate_step", 0.025), ("stages", "refine", "predict", None))


def plan_digest(plan: TuningPlan) -> str:
    """A hash of the whole plan, secrets included but not readable: a resumed campaign must run the same plan."""
    data = plan.model_dump(mode="json")
    for *path, name, default in ADDED_SINCE_KEPT:  # left out at their defaults: an older campaign resumes
        holder = data
        for key in path:
            holder = holder[key]
        if holder.get(name, default) == default:
            holder.pop(name, None)
    return hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()


def check_same_plan(stored: dict[str, Any], plan: TuningPlan, out_dir: str | Path) -> None:
    """A resumed campaign runs the plan it started with; only its GPU budget may change (raised to let a
    campaign that ran out finish): the budget decides when to stop, never what a trial answers."""
    digest = stored.get("plan_digest")
    if digest in (None, plan_digest(plan)):
        return
    old = ((stored.get("plan") or {}).get("budget") or {}).get("max_gpu_minutes")
    if old is not None:
        budget = plan.budget.model_copy(update={"max_gpu_minutes": old})
        if plan_digest(plan.model_copy(update={"budget": budget})) == digest:
            log.info("GPU budget changed on resume: %g -> %g min", old, plan.budget.max_gpu_minutes)
            return
    raise ValueError(f"{out_dir} was started with another plan: its trials answer that plan, "
                     "not this one (only budget.max_gpu_minutes may change on resume; start a new campaign "
                     "in a new folder)")
