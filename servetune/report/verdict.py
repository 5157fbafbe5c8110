"""The campaign's verdict in two or three plain lines: who is valid, on what workload, and by how much
the tuned answer beats the best valid protocol, at which level.

The same lines open the HTML report and the demo's terminal output. Goodput (requests/s meeting every
SLA bound) is the one unit every line compares in, whatever figure a protocol's author quoted; a
difference the noise or the campaign's ``min_improvement`` can cover is called a tie.
"""

from __future__ import annotations

from typing import Any

from servetune.checklist_report import plain_words
from servetune.engines.catalog import command_text
from servetune.plan.protocols import HEADLINES, headline_value
from servetune.report.campaign import CampaignView, config_key, counts, level_of
from servetune.result import TrialResult
from servetune.stats import compare, spread

DEFAULT_MIN_CHANGE = 0.02  # the plan's stages.refine.min_improvement when the experiment does not say


def _dist_text(d: dict[str, Any]) -> str:
    kind = d.get("kind")
    if kind == "fixed":
        return f"{d.get('value')}"
    if kind in ("uniform", "lognormal", "normal", "empirical") and d.get("max"):
        return f"{d.get('min', 1)}-{d.get('max')}"
    if kind == "lognormal":
        return f"~{d.get('median'):g}"
    if kind == "normal":
        return f"~{d.get('mean'):g}"
    return str(kind or "?")


def workload_text(spec: dict[str, Any]) -> str:
    """'1024-4096-token prompts, 160-352-token answers, a shared 512-token system prompt' from a spec."""
    if spec.get("trace"):
        return "a timed trace replay"
    parts = [f"{_dist_text(spec.get('input') or {})}-token prompts",
             f"{_dist_text(spec.get('output') or {})}-token answers"]
    prefix = spec.get("shared_prefix")
    if prefix:
        share = prefix.get("share_ratio", 1.0)
        parts.append(f"a shared {prefix.get('tokens')}-token system prompt"
                     + (f" on {share:.0%} of requests" if share < 1 else ""))
    else:
        parts.append("no shared prefix")
    if images := spec.get("images"):
        parts.append(f"{images.get('count', 1)} {images.get('width')}x{images.get('height')} image(s)"
                     f" on {images.get('ratio', 1.0):.0%} of requests")
    if turns := spec.get("multi_turn"):
        parts.append(f"{turns.get('turns')}-turn sessions")
    return ", ".join(parts)


def plain_rejection(t: TrialResult) -> list[str]:
    """Why the checklist rejected a trial, in plain words ([] when it did not)."""
    failed = [(r.get("checklist"), r.get("column")) for r in (t.validation or {}).get("results") or []
              if isinstance(r, dict) and r.get("success") is False]
    return plain_words(failed)


def _load_text(t: TrialResult, level_unit: str) -> str:
    level = level_of(t)
    if t.load.get("mode") == "waves":
        return f"static batches of {level}"
    return f"{level:g} req/s offered" if t.load.get("mode") == "rate" else f"{level} {level_unit}"


def _tuned_goodputs(campaign: CampaignView) -> list[float]:
    """The recommendation's repeats: its config at its level, every trial that counts."""
    rec = campaign.recommendation or {}
    key, level = config_key(rec.get("config") or {}), rec.get("rate") or rec.get("concurrency")
    ids = set(rec.get("evidence_trial_ids") or [])
    return [t.summary.goodput_rps or 0.0 for t in campaign.trials
            if t.trial_id in ids and counts(t) and t.stage != "protocol" and config_key(t.server_config) == key
            and level_of(t) == level]


def verdict_lines(campaign: CampaignView, protocols: list[TrialResult]) -> list[str]:
    """Two or three sentences: each protocol that does not count, the best valid one, the tuned answer
    against it (or "No answer" when the campaign found none)."""
    rec = campaign.recommendation
    lines: list[str] = []
    valid = [t for t in protocols if t.status == "ok" and counts(t)]
    for t in protocols:
        if t not in valid:
            invalid = [f"it did not measure the load it states ({'; '.join(t.summary.invalid_reasons)})"
                       ] if t.summary.valid is False else []
            why = plain_rejection(t) or invalid or [t.failure_reason or "its trial did not count"]
            lines.append(f"{_who(t)}'s {_quoted(t)} does not count: {'; '.join(why)}.")
    if not rec:
        lines.append("No answer: no config met the SLA at any level tried (see the recommendation section).")
        return lines
    flags = rec.get("config") or {}
    typed = command_text({k: True if v is None else v for k, v in sorted(flags.items())})  # None: a switch
    config = f"`{typed}`" if flags else "the engine defaults"
    level = (f"{rec['rate']:g} req/s (about {rec.get('concurrency')} in flight)" if rec.get("rate") is not None
             else f"{rec.get('concurrency')} concurrent streams")
    goodputs = _tuned_goodputs(campaign) or [rec.get("goodput_rps") or 0.0]
    tuned = spread(goodputs)
    head = (f"Tuned answer: {config} at {level}, goodput {tuned.mean or 0:.2f} req/s at the SLA"
            f" (mean of {tuned.n} seed(s))")
    if not valid:
        lines.append(head + ("; no protocol passed the checklist to compare with." if protocols else "."))
        return lines
    plan_spec = _plan_spec(campaign)
    same = [t for t in valid if _unseeded(t.workload.get("spec") or {}) == plan_spec]
    best = max(same or valid, key=lambda t: t.summary.goodput_rps or 0.0)
    other = "" if best in same else " (on its own workload, not the campaign's)"
    spec = (best.workload.get("spec") or {})
    lines.append(f"{_who(best)}'s {_quoted(best)} is valid{other}: {workload_text(spec)}; at"
                 f" {_load_text(best, 'streams')} its goodput is {best.summary.goodput_rps or 0:.2f} req/s.")
    min_change = float((((campaign.experiment.get("plan") or {}).get("stages") or {}).get("refine") or {})
                       .get("min_improvement", DEFAULT_MIN_CHANGE))
    cmp = compare(tuned, spread([best.summary.goodput_rps or 0.0]), min_change=min_change)
    noise = "" if cmp.noise is None else " and the noise"
    why = (f"{cmp.difference:+.2f} req/s; a difference counts beyond {cmp.threshold:.2f} req/s, the campaign's"
           f" {min_change:.0%} minimum{noise}")
    by = (f"{cmp.relative:+.0%} over {_who(best)}" if cmp.outcome == "better" and cmp.relative is not None
          else f"a tie with {_who(best)} within the noise" if cmp.outcome == "tie" else f"below {_who(best)}")
    lines.append(f"{head}: {by} ({why}).")
    return lines


def _quoted(t: TrialResult) -> str:
    """The figure a protocol's author quoted, as they quoted it: 'decode 2,612 tok/s'."""
    headline = str((t.load.get("protocol") or {}).get("headline") or "goodput_rps")
    label, unit = HEADLINES.get(headline, (headline, ""))
    value = headline_value(t.summary, headline)
    return f"{label} {'-' if value is None else f'{value:,.0f}' if value >= 100 else f'{value:.2f}'} {unit}".rstrip()


def _who(t: TrialResult) -> str:
    return str((t.load.get("protocol") or {}).get("name") or t.stage or "trial")


def _unseeded(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k not in ("seed", "name")}


def _plan_spec(campaign: CampaignView) -> dict[str, Any]:
    """The campaign's own workload (seed aside: repeats draw other seeds): the plan's, else its trials'."""
    spec = (campaign.experiment.get("plan") or {}).get("workload")
    if spec:
        return _unseeded(spec)
    specs = [t.workload.get("spec") or {} for t in campaign.trials if t.stage not in (None, "protocol")]
    return _unseeded(specs[0]) if specs else {}
