"""What the watcher watches: each plan's model and prompt template as Airflow Assets.

Parse-time and cheap (plan files only). The change check itself is servetune's
(servetune.fingerprint + the warehouse's asset_fingerprints table).
"""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import Asset

from servetune.fingerprint import Fingerprint, slug
from servetune.plan import TuningPlan, load_plan
from servetune_airflow.config import plan_files, plans_dir, runner_of


def template_source(plan: TuningPlan) -> str | None:
    """The prompt template a plan's results depend on: its own file, else the model's chat template."""
    if plan.prompt_template:
        return plan.prompt_template
    return plan.model if Path(plan.model).is_dir() else None


def _asset(kind: str, source: str) -> Asset:
    fp = Fingerprint(kind, slug(source), source, "", ())
    return Asset(name=f"{kind}__{fp.name}", uri=fp.asset_uri, extra={"source": source})


def plan_assets(folder: Path | None = None) -> dict[str, tuple[Asset, ...]]:
    """plan file -> (model asset[, template asset])."""
    out: dict[str, tuple[Asset, ...]] = {}
    for path in plan_files(folder):
        try:
            plan = load_plan(path)
        except Exception:  # noqa: BLE001 - a bad plan is reported by the campaign that runs it
            continue
        pair = [_asset("model", plan.model)]
        tmpl = template_source(plan)
        if tmpl:
            pair.append(_asset("prompt_template", tmpl))
        out[str(path)] = tuple(pair)
    return out


def plans_using(uris: list[str], runner_name: str, chosen: list[str] | None = None) -> list[str]:
    """Plans of this runner that use one of the assets (or the explicitly chosen plans)."""
    if chosen:
        files = [Path(c) if Path(c).is_absolute() else plans_dir() / c for c in chosen]
    else:
        wanted = set(uris)
        files = [Path(f) for f, assets in plan_assets().items() if wanted & {a.uri for a in assets}]
    return [str(f) for f in files if runner_of(load_plan(f)).name == runner_name]


def check_asset(uri: str, source: str, warehouse_url: str) -> dict:
    """Fingerprint the asset's source and record it; ``changed`` only when a stored digest differs."""
    from servetune.fingerprint import model_fingerprint, prompt_template_fingerprint
    from servetune.warehouse.fingerprints import record_fingerprint

    fp = model_fingerprint(source) if uri.startswith("servetune://model/") else prompt_template_fingerprint(source)
    return record_fingerprint(warehouse_url, uri, fp)
