"""SGLang's own tuning-guide signals, read from a trial summary.

SGLang's hyperparameter-tuning guide: a healthy server runs with token usage
above 0.9 and some queue; usage below 0.9 *with* a queue means admission is too cautious
(lower --schedule-conservativeness); frequent retractions (more than about one a minute)
mean it is too eager (raise it). These explain a recommendation, steer the direction of the
search and break ties between configs whose goodput is within noise.
"""

from __future__ import annotations

from servetune.result import TrialSummary
from servetune.sla import SLA

USAGE_TARGET = 0.9
RETRACTIONS_PER_MIN_OK = 1.0


def retractions_per_min(s: TrialSummary) -> float | None:
    if s.server_retractions is None:
        return None
    minutes = (s.window_s or 0.0) / 60.0
    return s.server_retractions / minutes if minutes > 0 else float(s.server_retractions)


def too_many_retractions(s: TrialSummary) -> bool:
    rate = retractions_per_min(s)
    return rate is not None and rate > RETRACTIONS_PER_MIN_OK


def underused_with_queue(s: TrialSummary) -> bool:
    """KV pool not full while requests wait: the scheduler is holding back."""
    return (
        s.server_token_usage_max is not None
        and s.server_token_usage_max < USAGE_TARGET
        and (s.server_queue_reqs_max or 0) > 0
    )


def conservativeness_direction(s: TrialSummary) -> int:
    """+1: raise schedule-conservativeness (retractions), -1: lower it (idle KV with a queue)."""
    if too_many_retractions(s):
        return 1
    if underused_with_queue(s):
        return -1
    return -1  # no signal: try more aggressive admission first, the cheaper direction to undo


def chunk_direction(s: TrialSummary, sla: SLA) -> int:
    """-1: smaller prefill chunks when decode latency (TPOT) is the tight bound, else +1 (faster prefill)."""
    tpot_slack = _slack(s.tpot_ms.p99, sla.p99_tpot_ms)
    ttft_slack = _slack(s.ttft_ms.p99, sla.p99_ttft_ms)
    if tpot_slack is not None and (ttft_slack is None or tpot_slack < ttft_slack):
        return -1
    return 1


def _slack(value: float | None, bound: float | None) -> float | None:
    if value is None or bound is None:
        return None
    return 1.0 - value / bound


def penalty(s: TrialSummary) -> tuple[float, float, float]:
    """Smaller is healthier: retraction rate, KV usage short of the 0.9 target while queueing, queue length."""
    rate = retractions_per_min(s) or 0.0
    short = max(0.0, USAGE_TARGET - (s.server_token_usage_max or 0.0)) if underused_with_queue(s) else 0.0
    return (round(rate, 3), round(short, 3), s.server_queue_reqs_max or 0.0)


def describe(s: TrialSummary, level: int) -> list[str]:
    """Plain sentences about the signals of one trial, for the recommendation's explanation."""
    out: list[str] = []
    if s.server_token_usage_max is not None:
        if s.server_token_usage_max > USAGE_TARGET:
            out.append(f"token_usage peaked at {s.server_token_usage_max:.2f} (> {USAGE_TARGET}) at concurrency"
                       f" {level}: the KV pool is fully used, as the SGLang tuning guide wants")
        elif underused_with_queue(s):
            out.append(f"token_usage peaked at {s.server_token_usage_max:.2f} (< {USAGE_TARGET}) while up to"
                       f" {s.server_queue_reqs_max:.0f} requests queued: admission is cautious; a lower"
                       " --schedule-conservativeness admits more")
        else:
            out.append(f"token_usage peaked at {s.server_token_usage_max:.2f} with no queue: the load, not the"
                       " KV pool, is the limit at this level")
    rate = retractions_per_min(s)
    if rate is not None:
        if rate > RETRACTIONS_PER_MIN_OK:
            out.append(f"{s.server_retractions:.0f} retractions ({rate:.1f}/min > {RETRACTIONS_PER_MIN_OK:g}/min):"
                       " the scheduler over-admits; a higher --schedule-conservativeness avoids them")
        else:
            out.append(f"{s.server_retractions:.0f} retractions ({rate:.1f}/min, within the guide's ~1/min)")
    if s.server_queue_reqs_max is not None:
        out.append(f"server queue peaked at {s.server_queue_reqs_max:.0f} requests"
                   f" (mean {s.server_queue_reqs_mean or 0:.1f})")
    return out
