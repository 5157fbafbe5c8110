"""Render a campaign as one self-contained HTML file (PNGs embedded as base64) with the PNGs beside it.

Self-contained so the report can be mailed, attached to an Airflow run or opened from object
storage without its folder; the PNG files are written too so they can be pasted elsewhere.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from servetune import __version__
from servetune.experiment import REPORT_FILE, ResultFolder
from servetune.report.campaign import (
    CampaignView,
    flag_value,
    is_simulated,
    level_label,
    level_of,
    meets_sla,
    simulated_mark,
)
from servetune.report.cost import answer_cost
from servetune.report.evidence import ceiling_evidence, failed_checks, goodput_text, validity_cells
from servetune.report.figures import ReportFigure, all_figures
from servetune.report.scheduler import hit_rate_text
from servetune.report.verdict import plain_rejection
from servetune.result import Percentiles, TrialResult

REPORT_NAME = REPORT_FILE
BOUGHT = "bought with "  # the recommendation's explanation line of what it cost (servetune.tuning.recommend)


@dataclass
class RenderedReport:
    html_path: Path
    png_paths: list[Path]
    figures: list[ReportFigure]


def fmt(value: Any, digits: int = 2) -> str:
    """Numbers for humans: '-' when missing, thousands separators, a fixed number of decimals."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _pair(p: Percentiles, digits: int = 1) -> str:
    return f"{fmt(p.p50, digits)} / {fmt(p.p99, digits)}"


_BEFORE = ("old", "previous", "from", "before")
_AFTER = ("new", "current", "to", "after")


def _is_change(value: Any) -> bool:
    return isinstance(value, dict) and any(k in value for k in _BEFORE + _AFTER)


def diff_rows(diff: dict[str, Any] | None) -> list[dict[str, str]] | None:
    """diff_from_previous as rows (field, previous, now, change); None when there was nothing to compare with.

    Reads the tuning layout ``{"config": {flag: {old, new}}, "figures": {name: {old, new, change}}}``
    and flat ``{field: {old, new}}`` or ``{field: [old, new]}`` maps alike. Figures that did not
    change are left out so the table shows only what moved.
    """
    if diff is None:
        return None
    rows: list[dict[str, str]] = []

    def add(name: str, change: Any, *, flag: bool = False) -> None:
        if _is_change(change):
            before = next((change[k] for k in _BEFORE if k in change), None)
            after = next((change[k] for k in _AFTER if k in change), None)
            rel = change.get("change")
        elif isinstance(change, list | tuple) and len(change) == 2:
            (before, after), rel = change, None
        else:
            return
        if before == after:
            return
        show = flag_text if flag else fmt  # flags as typed: 8192, not 8,192; a switch is set, not True
        rows.append({"field": name, "before": show(before), "after": show(after),
                     "change": f"{rel:+.1%}" if isinstance(rel, int | float) else ""})

    for name, change in diff.items():
        if name in ("against", "regressions"):  # shown above the table
            continue
        if isinstance(change, dict) and not _is_change(change):
            for sub, sub_change in change.items():  # a section: "config" flags, "figures"
                add(sub if name in ("config", "figures") else f"{name}.{sub}", sub_change, flag=name == "config")
        else:
            add(name, change)
    return rows


def flag_text(value: Any) -> str:
    """A flag's value as a user would type it: a store-true switch is 'set' (never 'True'), unset is '-'."""
    return "set" if value is True else "-" if value is None or value is False else str(value)


def rec_level(rec: dict[str, Any]) -> dict[str, str]:
    """The level the answer runs at: the capacity in requests/s (rate mode, with what it keeps in flight) or
    the concurrency, so the table says it even when no flag changed."""
    if isinstance(rec.get("rate"), int | float):
        return {"label": "rate (capacity at the SLA)",
                "value": f"{rec['rate']:g} req/s, about {fmt(rec.get('concurrency'))} in flight"}
    return {"label": "concurrency (streams in flight)", "value": fmt(rec.get("concurrency"))}


def flag_rows(config: dict[str, Any]) -> list[dict[str, str]]:
    """The recommended flags, a switch as '(switch)' not 'True' (the typed line beside it: ``command_text``)."""
    return [{"flag": str(k), "value": "(switch)" if v is True else flag_text(v)}
            for k, v in sorted(config.items()) if v is not None and v is not False]


def _validation_cells(t: TrialResult) -> tuple[str, str, list[str]]:
    v = t.validation
    if not v:
        return "not validated", "muted", []
    failed = failed_checks(t)
    if v.get("success"):
        return "passed", "ok", failed
    return f"failed ({len(failed)})" if failed else "failed", "bad", failed


def checklist_rows(campaign: CampaignView) -> list[dict[str, Any]]:
    rows = []
    sla = campaign.sla
    for t in campaign.trials:
        label, css, failed = _validation_cells(t)
        met = meets_sla(t, sla)
        v = validity_cells(t)
        verdict = ("met" if met else "missed") if sla else "no SLA"
        if v["validity"] == "INVALID" and sla:
            verdict = "not judged (INVALID)"
        rows.append({"trial_id": t.trial_id, "stage": t.stage or "bench", "concurrency": fmt(level_of(t)),
                     "status": t.status, "validation": label, "validation_class": css, "failed": failed,
                     "failure_reason": t.failure_reason, "validity": v["validity"], "plain": plain_rejection(t),
                     "validity_class": v["validity_class"], "invalid_reasons": t.summary.invalid_reasons,
                     "sla": verdict, "sla_class": "ok" if met else "bad", "simulated": is_simulated(t)})
    return rows


def trial_rows(campaign: CampaignView) -> list[dict[str, str]]:
    """One row per trial: its figures and its validity (window, completions vs needed, in flight)."""
    rows = []
    for t in campaign.trials:
        s = t.summary
        cfg = t.server_config
        knobs = [f"{short}={flag_value(cfg, k)}" for k, short in (("chunked_prefill_size", "chunk"),
                                                                   ("schedule_conservativeness", "cons"),
                                                                   ("max_running_requests", "max-running"))
                 if flag_value(cfg, k) is not None]
        rows.append({
            "trial_id": t.trial_id, "stage": t.stage or "bench", "concurrency": fmt(level_of(t)),
            "config": ", ".join(knobs) or "-", "rps": fmt(s.request_throughput), "goodput": fmt(s.goodput_rps),
            "out_tps": fmt(s.output_tokens_per_s, 0), "ttft": _pair(s.ttft_ms), "tpot": _pair(s.tpot_ms),
            "e2e": fmt(s.e2e_ms.p99, 0), "errors": pct(s.error_rate), "hit": _hit(t),
            "gpu_peak": pct(s.gpu_mem_peak_fraction) + (" (simulated)" if is_simulated(t) and
                                                       s.gpu_mem_peak_fraction is not None else ""),
            "simulated": is_simulated(t), **validity_cells(t),
        })
    return rows


def _hit(t: TrialResult) -> str:
    """The usage hit rate, with the scheduler log's beside it when the trial has one."""
    sched = hit_rate_text([t])
    return pct(t.summary.prefix_hit_rate) + (f" (scheduler {sched})" if sched else "")


def _energy_cards(rec: dict[str, Any]) -> list[dict[str, str]]:
    """Energy and cost at the answer (servetune.energy), and the objective when it is not goodput."""
    cards = []
    if rec.get("energy_per_output_token_j") is not None:
        cards.append({"key": "j-per-token", "label": "J per output token",
                      "value": fmt(rec["energy_per_output_token_j"], 3)})
    if rec.get("cost_per_mtok_usd") is not None:
        cards.append({"key": "cost-per-mtok", "label": "$ per million output tokens",
                      "value": fmt(rec["cost_per_mtok_usd"], 3)})
    if rec.get("objective") not in (None, "goodput"):
        cards.append({"key": "objective", "label": "objective (under the SLA)", "value": str(rec["objective"])})
    return cards


def key_cards(campaign: CampaignView) -> list[dict[str, str]]:
    """The headline numbers: from the recommendation when there is one, else from the best curve trial."""
    ceiling, _ = campaign.ceiling()
    rec = campaign.recommendation
    capacity = campaign.capacity()
    cards = [{"key": "capacity", "label": "capacity req/s at the SLA", "value": fmt(capacity, 3)} if capacity
             else {"key": "ceiling", "label": "concurrency ceiling", "value": fmt(ceiling)}]
    if rec:
        p99s = dict(rec.get("p99s") or {})  # nested (the brief's layout) or flat p99_*_ms (tuning.Recommendation)
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            p99s.setdefault(name, rec.get(f"p99_{name}"))
        cards += [
            {"key": "recommended-concurrency", "value": fmt(rec.get("concurrency")),
             "label": "in flight at capacity (Little's law)" if capacity else "recommended concurrency"},
            {"key": "goodput", "label": "goodput req/s", "value": _with_ci(rec)},
            {"key": "repeats", "label": "valid repeats", "value": fmt(rec.get("repeats"))},
            {"key": "output-tps", "label": "output tok/s", "value": fmt(rec.get("output_tokens_per_s"), 0)},
            {"key": "p99-ttft", "label": "p99 TTFT ms", "value": fmt(p99s.get("ttft_ms"), 1)},
            {"key": "p99-tpot", "label": "p99 TPOT ms", "value": fmt(p99s.get("tpot_ms"), 1)},
            {"key": "p99-e2e", "label": "p99 E2E ms", "value": fmt(p99s.get("e2e_ms"), 0)},
            {"key": "prefix-hit-rate", "label": "prefix hit rate", "value": pct(rec.get("prefix_hit_rate"))},
            *_energy_cards(rec),
        ]
        evidence = {str(x) for x in rec.get("evidence_trial_ids") or []}
        sched = hit_rate_text([t for t in campaign.trials if t.trial_id in evidence])
    else:
        curve = campaign.curve_trials() or campaign.trials
        best = max(curve, key=lambda t: t.summary.goodput_rps or 0.0, default=None)
        if best is not None:
            s = best.summary
            cards += [
                {"key": "goodput", "label": "goodput req/s", "value": fmt(s.goodput_rps)},
                {"key": "output-tps", "label": "output tok/s", "value": fmt(s.output_tokens_per_s, 0)},
                {"key": "p99-ttft", "label": "p99 TTFT ms", "value": fmt(s.ttft_ms.p99, 1)},
                {"key": "p99-tpot", "label": "p99 TPOT ms", "value": fmt(s.tpot_ms.p99, 1)},
                {"key": "prefix-hit-rate", "label": "prefix hit rate", "value": pct(s.prefix_hit_rate)},
            ]
        sched = hit_rate_text([best] if best is not None else [])
    if sched:
        cards.append({"key": "sched-hit-rate", "label": "scheduler cache hit rate", "value": sched})
    accepted = sum(1 for t in campaign.trials if t.status == "ok")
    cards.append({"key": "trials", "label": "trials ok / total", "value": f"{accepted} / {len(campaign.trials)}"})
    if (cost := answer_cost(campaign)) is not None:  # what the answer cost (servetune.report.cost)
        cards.append({"key": "gpu-minutes", "label": "GPU min" + cost.simulated, "value": fmt(cost.minutes, 1)})
    if any(t.summary.valid is not None for t in campaign.trials):
        # the correctness stage sends one request: it never has a steady window and is no measurement
        invalid = sum(1 for t in campaign.trials if t.summary.valid is False and t.stage != "correctness")
        cards.append({"key": "invalid", "label": "INVALID trials (not used)", "value": str(invalid)})
    return cards


def _with_ci(rec: dict[str, Any]) -> str:
    """The goodput card: '8.60 ± 0.21' when the recommendation states its 95% interval."""
    ci = rec.get("goodput_ci95")
    return fmt(rec.get("goodput_rps")) + (f" ± {ci:,.2f}" if isinstance(ci, int | float) else "")


def _environment() -> Environment:
    return Environment(loader=PackageLoader("servetune.report", "templates"),
                       autoescape=select_autoescape(["html", "j2"]), undefined=StrictUndefined,
                       trim_blocks=True, lstrip_blocks=True)


def render_html(campaign: CampaignView, figures: list[ReportFigure], png_files: dict[str, str]) -> str:
    exp = campaign.experiment
    is_campaign = bool(exp.get("plan")) or len(campaign.trials) > 1
    title = f"{campaign.model or 'unknown model'}" + ("" if is_campaign else " (single bench trial)")
    meta = [(k, exp[k]) for k in ("engine", "trigger", "status", "started_at", "finished_at", "dag_run_id")
            if exp.get(k)]
    _, ceiling_source = campaign.ceiling()
    rec = campaign.recommendation
    from servetune.engines.catalog import command_text  # the one rendering of flags as typed

    context = {
        "title": title, "experiment_id": campaign.experiment_id, "meta": meta, "version": __version__,
        "source": campaign.source, "generated_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cards": key_cards(campaign), "ceiling_source": ceiling_source, "sla": campaign.sla,
        "recommendation": rec, "is_campaign": is_campaign,
        "goodput_text": goodput_text(rec) if rec else "", "ties": list((rec or {}).get("ties") or []),
        "has_ties_field": bool(rec) and "ties" in rec, "ceiling_evidence": ceiling_evidence(campaign),
        "diff_rows": diff_rows(rec.get("diff_from_previous")) if rec else None,
        "diff_against": (rec.get("diff_from_previous") or {}).get("against") if rec else None,
        "regressions": (rec.get("diff_from_previous") or {}).get("regressions") or [] if rec else [],
        "figures": [{"key": f.key, "title": f.title, "caption": f.caption, "png": f.png, "note": f.note,
                     "b64": base64.b64encode(f.png).decode() if f.png else "", "file": png_files.get(f.key, "")}
                    for f in figures],
        "checklist": checklist_rows(campaign), "trial_rows": trial_rows(campaign),
        "level_label": level_label(campaign.trials), "simulated": simulated_mark(campaign.trials).strip(" ()"),
        "flag_rows": flag_rows((rec or {}).get("config") or {}),
        "command": command_text((rec or {}).get("config") or {}),
        "rec_level": rec_level(rec) if rec else None,
        "cost": cost.text(answered=bool(rec)) if (cost := answer_cost(campaign)) else None,
    }
    from servetune.report.diagnoses import diagnosis_rows  # the "Diagnoses" section (servetune.diagnose)

    context["diagnoses"] = diagnosis_rows(campaign)
    from servetune.report.protocols import protocol_rows, protocol_trials  # "Protocols side by side"
    from servetune.report.verdict import verdict_lines  # the two or three lines that open the report

    context["protocols"] = protocol_rows(campaign)
    context["verdict"] = verdict_lines(campaign, protocol_trials(campaign)) if is_campaign else []
    ties = set(context["ties"])  # a tie is listed once, under "Ties", not again among the explanation's lines
    # ... and the tuner's own "bought with ..." line once, as the cost line (servetune.report.cost)
    context["explanation"] = [line for line in (rec or {}).get("explanation") or [] if line not in ties
                              and not (context["cost"] and line.startswith(BOUGHT))]
    from servetune.report.images import image_rows  # the "Images" section (servetune.multimodal)

    context["image_rows"] = image_rows(campaign)
    return _environment().get_template("report.html.j2").render(**context)


def write_report(campaign: CampaignView, out_dir: str | Path) -> RenderedReport:
    """Draw every figure, write the PNGs and ``report.html`` into ``out_dir`` (created if missing).

    Drawn from ``campaign.redacted()``: a report is shared, so it never shows a secret the data held."""
    campaign = campaign.redacted()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figures = all_figures(campaign)
    pngs: list[Path] = []
    files: dict[str, str] = {}
    for fig in figures:
        if fig.png:
            path = out / f"{fig.key}.png"
            path.write_bytes(fig.png)
            pngs.append(path)
            files[fig.key] = path.name
    html_path = out / REPORT_NAME
    tmp = html_path.with_suffix(".html.tmp")
    tmp.write_text(render_html(campaign, figures, files), encoding="utf-8")
    tmp.replace(html_path)
    return RenderedReport(html_path=html_path, png_paths=pngs, figures=figures)


def default_out_dir(source: str, campaign: CampaignView) -> Path:
    """Beside the data: DIR/report for a result dir, FILE-report/ for a JSON, ./report-<id> for the warehouse."""
    path = Path(source)
    if path.is_dir():
        return ResultFolder(path).report_dir
    if path.is_file():
        return path.with_name(path.stem + "-report")
    return Path(f"report-{campaign.experiment_id or source}")
