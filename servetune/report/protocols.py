"""The report's "Protocols side by side": each way of measuring the plan ran, and the tuned answer.

A protocol trial (``stage: protocol``, servetune.plan.protocols) quotes one figure; the row shows that
figure beside every other one its trial measured, and the checklist's verdict with the items it failed
and the values they saw, so a reader sees why one engineer's number cannot settle the question. The last
row is the campaign's recommendation from its own evidence trial.
"""

from __future__ import annotations

from typing import Any

from servetune.plan.protocols import HEADLINES, headline_value
from servetune.report.campaign import CampaignView, flag_value, is_simulated, level_of, meets_sla
from servetune.report.evidence import failed_checks
from servetune.report.verdict import plain_rejection
from servetune.result import TrialResult


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _verdict(t: TrialResult) -> tuple[str, str]:
    if t.status == "failed":
        return f"failed: {t.failure_reason or 'no reason recorded'}", "bad"
    if t.validation is None:
        return "not validated", "muted"
    if t.status == "rejected":
        return "rejected", "bad"
    return "accepted", "ok"


def _row(t: TrialResult, sla: dict[str, float], *, who: str, about: str, quoted: str, short: str) -> dict[str, Any]:
    s = t.summary
    verdict, css = _verdict(t)
    sla_text = ("met" if meets_sla(t, sla) else "missed") if sla and t.status != "failed" else "-"
    static, level = t.load.get("mode") == "waves", level_of(t)
    return {
        "who": who, "about": about, "quoted": quoted, "quoted_short": short, "trial_id": t.trial_id,
        "load": "-" if level is None else f"static batches of {_num(level)}" if static else f"{_num(level)} streams",
        "load_short": "-" if level is None else f"batch {_num(level)}, static" if static else f"{_num(level)} streams",
        "radix": "off" if (flag_value(t.server_config, "disable-radix-cache")  # SGLang, sim
                           or flag_value(t.server_config, "enable-prefix-caching") is False) else "on",  # vLLM
        "decode_tps": _num(s.decode_tokens_per_s), "output_tps": _num(s.output_tokens_per_s),
        "ttft_p99": _num(s.ttft_ms.p99), "tpot_p99": _num(s.tpot_ms.p99, 1), "e2e_p99": _num(s.e2e_ms.p99),
        "goodput": _num(s.goodput_rps, 2), "hit": "-" if s.prefix_hit_rate is None else f"{s.prefix_hit_rate:.0%}",
        "input_len": f"{_num(s.input_len.p50)} / {_num(s.input_len.p99)}",
        "verdict": verdict, "verdict_class": css, "failed": failed_checks(t), "plain": plain_rejection(t),
        "sla": sla_text,
        "simulated": is_simulated(t),
    }


def protocol_trials(campaign: CampaignView) -> list[TrialResult]:
    """The protocol trials in the plan's order."""
    planned = [p.get("name") for p in (campaign.experiment.get("plan") or {}).get("protocols") or []]
    return sorted((t for t in campaign.trials if t.stage == "protocol"), key=lambda t: (
        planned.index(name) if (name := (t.load.get("protocol") or {}).get("name")) in planned else len(planned),
        t.created_at))


def protocol_rows(campaign: CampaignView) -> list[dict[str, Any]]:
    """One row per protocol trial, in the plan's order, then the recommendation's ([] without protocols).

    The tuned row quotes the recommendation's figures (means over its repeats, as the key figures do);
    the other columns come from one of its trials."""
    protocols = protocol_trials(campaign)
    if not protocols:
        return []
    sla = campaign.sla
    rows = []
    for t in protocols:
        p = t.load.get("protocol") or {}
        headline = str(p.get("headline") or "goodput_rps")
        value = headline_value(t.summary, headline)
        label, unit = HEADLINES.get(headline, (headline, ""))
        quoted = f"{headline} = {_num(value, 1)} {unit}".rstrip()
        short = f"{label} {_num(value)} {unit}".rstrip()
        rows.append(_row(t, sla, who=str(p.get("name") or "protocol"), about=str(p.get("about") or ""),
                         quoted=quoted, short=short))
    rec = campaign.recommendation or {}
    by_id = {t.trial_id: t for t in campaign.trials}
    evidence = [by_id[i] for i in rec.get("evidence_trial_ids") or [] if i in by_id]
    at_answer = [t for t in evidence if level_of(t) == rec.get("concurrency") and t.status != "failed"]
    if at_answer:
        quoted = (f"goodput_rps = {_num(rec.get('goodput_rps'), 2)} req/s at the SLA,"
                  f" concurrency {rec.get('concurrency')}")
        short = f"goodput {_num(rec.get('goodput_rps'), 2)} req/s at the SLA"
        n = rec.get("repeats") or 1
        row = _row(at_answer[0], sla, who="tuned (servetune)", quoted=quoted, short=short,
                   about="the staged campaign: the plan's workload, continuous batching, one steady window"
                         + (f"; figures are means over {n} seeds" if n > 1 else ""))
        for key, field, digits in (("ttft_p99", "p99_ttft_ms", 0), ("tpot_p99", "p99_tpot_ms", 1),
                                   ("e2e_p99", "p99_e2e_ms", 0), ("goodput", "goodput_rps", 2),
                                   ("output_tps", "output_tokens_per_s", 0)):
            if isinstance(rec.get(field), int | float):
                row[key] = _num(rec[field], digits)
        rows.append(row)
    return rows


def rejection_sentences(rows: list[dict[str, Any]]) -> list[str]:
    """'engineer-a: rejected by the checklist: <plain words> (steady_window: ...)' for each protocol that did not
    pass."""
    return [f"{r['who']}: rejected by the checklist: {'; '.join(r['plain']) or 'see its trial'}"
            f" (checklist detail: {'; '.join(r['failed']) or '-'})" for r in rows if r["verdict"] == "rejected"]
