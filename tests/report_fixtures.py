"""Builds campaign result directories for the report and history tests, in code.

The layout is exactly what the tuning CLI writes (experiment.json, trials/<id>.json,
recommendation.json); the numbers follow a plausible saturating curve so the figures have shape,
and one ramp level misses the SLA so the ceiling and the failed checklist rows are exercised.
"""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from servetune.energy import apply_energy
from servetune.result import Percentiles, TrialResult, TrialSummary
from servetune.stats import compare, spread
from servetune.tuning.recommend import diff_recommendations
from servetune.tuning.state import Recommendation
from servetune.validation.checklist import ExpectationOutcome, ValidationReport

GIB = 1024**3
SLA = {"p99_ttft_ms": 800.0, "p99_tpot_ms": 60.0, "p99_e2e_ms": 20000.0, "max_error_rate": 0.01}
RAMP = (16, 32, 64, 96, 128)
CHUNKS = (2048, 4096, 8192)
CONSERVATIVENESS = (0.3, 0.7, 1.0)


def _pcts(p50: float, p99: float) -> Percentiles:
    return Percentiles(count=300, mean=(p50 + p99) / 2, p50=p50, p90=p50 + 0.6 * (p99 - p50),
                       p95=p50 + 0.8 * (p99 - p50), p99=p99, max=p99 * 1.1, min=p50 * 0.5)


def make_trial(*, experiment_id: str, stage: str, concurrency: int, created: datetime,
               chunk: int = 8192, cons: float = 1.0, max_running: int | None = None,
               hit_rate: float = 0.62, speed: float = 1.0, failed_check: str | None = None,
               model: str = "llama-3.1-8b", valid: bool | None = None, seed: int = 0) -> TrialResult:
    """One trial whose figures follow a saturating throughput curve (speed scales the whole curve).

    ``valid`` None leaves the validity figures unset (a result from before servetune.validity);
    True/False fills them as servetune.metrics would for a held / a broken closed-loop run."""
    c = concurrency
    tps_per_stream = 55.0 * speed / (1 + c / 90)
    out_tps = c * tps_per_stream
    rps = out_tps / 256
    ttft_p99 = 90 + 2.9 * c ** 1.25 / speed
    tpot_p99 = 1000 / tps_per_stream * 1.3
    good = rps if (ttft_p99 <= SLA["p99_ttft_ms"] and tpot_p99 <= SLA["p99_tpot_ms"]) else rps * 0.55
    total = 80 * GIB
    peak = 0.55 * total + min(0.38, c / 400) * total
    samples = []
    for i in range(55):  # 0 .. 64.8 s: the curve covers the window (4 .. 64 s)
        t = i * 1.2
        used = 0.55 * total + (peak - 0.55 * total) * (1 - math.exp(-t / 12))
        samples.append({"t_s": t, "gpu": 0, "mem_used": int(used), "mem_total": total, "util": 90, "power_w": 600.0})
    summary = TrialSummary(
        requests_total=340, requests_measured=300, requests_warmup=40, requests_ok=300, error_rate=0.0,
        window_start_s=4.0, window_end_s=64.0, window_s=60.0,
        ttft_ms=_pcts(ttft_p99 * 0.45, ttft_p99), tpot_ms=_pcts(tpot_p99 * 0.7, tpot_p99),
        itl_ms=_pcts(tpot_p99 * 0.65, tpot_p99 * 1.4), e2e_ms=_pcts(ttft_p99 + 255 * tpot_p99 * 0.7,
                                                                    ttft_p99 + 255 * tpot_p99),
        input_len=_pcts(1000, 3800), output_len=_pcts(256, 256), lengths_exact=True,
        request_throughput=rps, output_tokens_per_s=out_tps, input_tokens_per_s=rps * 1200,
        total_tokens_per_s=out_tps + rps * 1200, decode_tokens_per_s=tps_per_stream,
        goodput_rps=good, goodput_fraction=good / rps, sla=SLA,
        prefix_hit_rate=hit_rate, prefix_hit_rate_server=hit_rate - 0.01,
        gpu_state="ok", gpu_samples=len(samples), gpu_sample_interval_ms=1200, gpu_mem_total_bytes=total,
        gpu_mem_peak_bytes=int(peak), gpu_mem_peak_fraction=peak / total, gpu_clean_at_start=True,
    )
    if valid is not None:
        _set_validity(summary, c, valid)
    apply_energy(summary, {"state": "ok", "samples": samples, "interval_ms": 1200})  # 600 W: the power curve
    report = ValidationReport(
        success=failed_check is None, suites=["trial_summary", "trial_gpu"], gx_version="1.24.1",
        results=[
            ExpectationOutcome(suite="trial_summary", expectation="expect_column_values_to_not_be_null",
                               column="input_len_p50", checklist="length_distribution", success=True),
            ExpectationOutcome(suite="trial_gpu", expectation=failed_check or "expect_column_values_to_be_between",
                               column="t_s", checklist="gpu_memory_curve", success=failed_check is None),
        ])
    validation = report.model_dump(mode="json")
    return TrialResult(
        trial_id=uuid.uuid4().hex, created_at=created.isoformat(), status="ok" if failed_check is None else "rejected",
        failure_reason=report.failure_reason(), stage=stage,
        experiment_id=experiment_id,
        target={"url": "http://127.0.0.1:30000", "endpoint": "chat", "model": model, "engine": "sglang"},
        # flag spelling as servetune.tuning writes it (the report also reads chunked_prefill_size)
        server_config={"chunked-prefill-size": chunk, "schedule-conservativeness": cons,
                       "max-running-requests": max_running, "enable-cache-report": True},
        load={"mode": "concurrency", "concurrency": c, "requests": 340, "warmup": 40},
        sla=SLA, workload={"fingerprint": "wl-123", "lengths_exact": True, "seed": 1234 + seed},
        t0_unix=created.timestamp(), gpu={"state": "ok", "samples": samples, "interval_ms": 1200},
        summary=summary, validation=validation,
    )


def _set_validity(s: TrialSummary, c: int, valid: bool) -> None:
    """The validity figures of a closed-loop trial at ``c`` streams; INVALID: a short window, the load not held."""
    s.valid, s.scenario, s.window_source, s.offered_concurrency = valid, "closed_loop", "steady", c
    s.completions_needed = max(200, 4 * c)
    s.in_flight_target = float(c)
    s.throughput_mismatch = 0.002
    if valid:
        s.completions_in_window = s.completions_needed + 40
        s.in_flight_mean, s.in_flight_min = 0.99 * c, 0.95 * c
        return
    s.window_s, s.completions_in_window = 8.4, 120
    s.in_flight_mean, s.in_flight_min = 0.64 * c, 0.42 * c
    s.invalid_reasons = [
        f"steady window {s.window_s:.1f} s < 20 s",
        f"120 requests completed in the window < {s.completions_needed} needed (max(200, 4 x {c} streams))",
        f"in flight {s.in_flight_mean:.1f} on average (lowest {s.in_flight_min:.1f}) of {c} streams < 90%:"
        " the client did not hold the load",
    ]


def write_campaign(root: Path, *, model: str = "llama-3.1-8b", started: datetime | None = None,
                   speed: float = 1.0, hit_rate: float = 0.62, previous: dict[str, Any] | None = None,
                   experiment_id: str | None = None, noisy: bool = False) -> Path:
    """A whole campaign directory: correctness, baseline, ramp (one level over the SLA), refinement grid.

    ``noisy``: as the tuner now writes it: every trial carries its validity figures, c=64 and the best
    refinement cell have three repeats, c=96 has a passing and a failing VALID repeat (marginal, a tie
    fails) and an INVALID trial whose numbers would pass; the recommendation states its repeats, CI and
    ties, the experiment its ceiling section."""
    exp_id = experiment_id or uuid.uuid4().hex
    started = started or datetime(2026, 11, 2, 3, 0, tzinfo=UTC)
    directory = root / exp_id
    trials: list[TrialResult] = []
    t = started
    valid = True if noisy else None

    def nxt() -> datetime:
        nonlocal t
        t += timedelta(minutes=2)
        return t

    def add(stage: str, c: int, **kw: Any) -> TrialResult:
        kw.setdefault("valid", valid)
        kw.setdefault("speed", speed)
        trial = make_trial(experiment_id=exp_id, stage=stage, concurrency=c, created=nxt(), hit_rate=hit_rate,
                           model=model, **kw)
        trials.append(trial)
        return trial

    add("correctness", 1)
    add("baseline", 8)
    for c in RAMP:
        add("ramp", c, failed_check="expect_gpu_samples_cover_window" if c == 128 else None)
        if noisy and c == 64:
            add("ramp", c, speed=speed * 0.97, seed=1)
            add("ramp", c, speed=speed * 1.03, seed=2)
        if noisy and c == 96:
            add("ramp", c, speed=speed * 1.3, seed=1)  # passes: the level is marginal
            add("ramp", c, speed=speed * 1.6, seed=2, valid=False)  # would pass, but INVALID
    ceiling = 64
    for chunk in CHUNKS:
        for cons in CONSERVATIVENESS:
            if (chunk, cons) == (2048, 1.0):
                continue  # an unmeasured cell: the heatmap must show it as such
            boost = 1 + (0.04 if chunk == 4096 else 0) + (0.03 if cons == 0.7 else 0)
            add("refine", ceiling, chunk=chunk, cons=cons, speed=speed * boost)
            if noisy and (chunk, cons) == (4096, 0.7):
                add("refine", ceiling, chunk=chunk, cons=cons, speed=speed * boost * 0.98, seed=1)
                add("refine", ceiling, chunk=chunk, cons=cons, speed=speed * boost * 1.02, seed=2)
    best = max((x for x in trials if x.stage == "refine"), key=lambda x: x.summary.goodput_rps or 0.0)
    for trial in trials:
        trial.save(directory / "trials" / f"{trial.trial_id}.json")
    rec = _recommendation(best, ceiling, trials if noisy else [best])
    if previous is not None:
        rec.diff_from_previous = diff_recommendations(previous, rec)
    recommendation = rec.model_dump(mode="json")
    experiment = {
        "experiment_id": exp_id, "model": model, "engine": "sglang", "model_fingerprint": "mf-" + model,
        "prompt_template_fingerprint": "pt-1", "trigger": "weekly", "dag_run_id": f"scheduled__{started:%Y%m%d}",
        "plan": {"model": model, "sla": {k: v for k, v in SLA.items() if k.startswith("p99")}},
        "status": "succeeded", "started_at": started.isoformat(), "finished_at": t.isoformat(),
        "recommendation": recommendation,
    }
    if noisy:
        ramp = [x for x in trials if x.stage == "ramp"]
        experiment["ceiling"] = {
            "concurrency": ceiling, "kind": "sla", "first_fail": 96, "marginal": [96],
            "reasons": ["failed 1 of 2 repeats", "p99 TTFT over 800 ms"],
            "pass_trial_ids": [x.trial_id for x in ramp if x.load["concurrency"] == 64],
            "fail_trial_ids": [x.trial_id for x in ramp if x.load["concurrency"] == 96 and x.summary.valid],
        }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "experiment.json").write_bytes(orjson.dumps(experiment))
    (directory / "recommendation.json").write_bytes(orjson.dumps(recommendation))
    return directory


def _recommendation(best: TrialResult, ceiling: int, trials: list[TrialResult]) -> Recommendation:
    """As servetune.tuning.recommend builds it: the means over the chosen config's repeats, with the CI."""
    repeats = [x for x in trials if x.stage == "refine" and x.server_config == best.server_config]
    goodput = spread([x.summary.goodput_rps for x in repeats])
    s = best.summary
    ties = []
    if len(repeats) > 1:
        other = spread([goodput.mean * 0.995, goodput.mean * 1.004, goodput.mean * 0.99])
        ties.append("schedule-conservativeness 0.3 against 0.7 at concurrency 64: tie, kept the simpler config ("
                    + compare(other, goodput, min_change=0.03).text() + ")")
    return Recommendation(
        config={"chunked-prefill-size": best.server_config["chunked-prefill-size"],
                "schedule-conservativeness": best.server_config["schedule-conservativeness"],
                "max-running-requests": ceiling, "enable-cache-report": True},
        concurrency=ceiling, evidence_trial_ids=[x.trial_id for x in repeats], goodput_rps=goodput.mean,
        p99_ttft_ms=s.ttft_ms.p99, p99_tpot_ms=s.tpot_ms.p99, p99_e2e_ms=s.e2e_ms.p99,
        output_tokens_per_s=s.output_tokens_per_s, prefix_hit_rate=s.prefix_hit_rate,
        explanation=[f"ceiling at concurrency {ceiling} (sla): c=96 missed the p99 TTFT bound",
                     "chunked-prefill-size 4096 with schedule-conservativeness 0.7 gave the most goodput"],
        repeats=goodput.n, goodput_ci95=goodput.ci95, goodput_cv=goodput.cv, ties=ties,
    )
