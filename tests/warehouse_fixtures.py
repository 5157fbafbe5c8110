"""Build realistic ``TrialResult`` objects in code for the warehouse and validation tests."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from servetune.energy import apply_energy
from servetune.records import RequestRecord
from servetune.result import Percentiles, TrialResult, TrialSummary
from servetune.validity import ValidityRules


def _pct(values: list[float]) -> Percentiles:
    v = sorted(values)
    n = len(v)

    def q(p: float) -> float:
        return v[min(n - 1, int(p * n))]

    return Percentiles(count=n, mean=sum(v) / n, p50=q(0.5), p90=q(0.9), p95=q(0.95), p99=q(0.99),
                       max=v[-1], min=v[0])


#: rules a hand-built trial of ~12 s and 240 requests satisfies
FIXTURE_RULES = ValidityRules(min_window_s=5.0, min_completions=100, completions_per_stream=4.0)


def make_trial(
    *,
    trial_id: str | None = None,
    experiment_id: str | None = None,
    model: str = "llama-8b",
    n: int = 240,
    warmup: int = 10,
    concurrency: int = 16,
    hit_rate: float = 0.6,
    t0_unix: float | None = None,
    seed: int = 0,
    workload_fingerprint: str = "wl-0001",
    interval_ms: float = 100.0,
    stage: str | None = "ramp",
    ttft_scale: float = 1.0,
) -> TrialResult:
    """A clean, passing trial: ``n`` measured requests, a GPU curve covering the window."""
    rng = random.Random(seed)
    records: list[RequestRecord] = []
    for i in range(n + warmup):
        prompt = rng.randint(800, 1200)
        out = 128
        ttft = rng.uniform(40, 120) * ttft_scale
        tpot = rng.uniform(8, 14)
        e2e = ttft + tpot * (out - 1)
        offsets = [ttft + k * tpot * 8 for k in range(16)]
        records.append(RequestRecord(
            request_id=i, t_send_s=0.05 * i, queue_ms=rng.uniform(0, 5), ttft_ms=ttft, e2e_ms=e2e,
            chunk_offsets_ms=offsets, chunk_tokens=[8] * 16, token_count_source="meta_info",
            prompt_tokens=prompt, completion_tokens=out, cached_tokens=int(prompt * hit_rate),
            requested_input_tokens=prompt, requested_output_tokens=out, prefix_group=0,
            warmup=i < warmup, http_status=200,
        ))
    measured = [r for r in records if not r.warmup]
    window_start, window_end = measured[0].t_send_s, measured[-1].t_send_s + measured[-1].e2e_ms / 1000
    window = window_end - window_start
    out_tokens = sum(r.completion_tokens for r in measured)
    samples = []
    t = 0.0
    while t <= window_end + interval_ms / 1000:
        samples.append({"t_s": round(t, 3), "gpu": 0, "mem_used": 60_000_000_000 + int(t * 1e6),
                        "mem_total": 80_000_000_000, "util": 0.9, "power_w": 600.0})
        t += interval_ms / 1000
    mem = [s["mem_used"] for s in samples]
    summary = TrialSummary(
        requests_total=len(records), requests_measured=len(measured), requests_warmup=warmup,
        requests_ok=len(measured), requests_failed=0, error_rate=0.0,
        window_start_s=window_start, window_end_s=window_end, window_s=window, window_source="stated",
        ttft_ms=_pct([r.ttft_ms for r in measured]),
        itl_ms=_pct([g for r in measured for g in r.itl_gaps_ms()]),
        tpot_ms=_pct([r.tpot_ms() for r in measured]),
        e2e_ms=_pct([r.e2e_ms for r in measured]),
        queue_ms=_pct([r.queue_ms for r in measured]),
        input_len=_pct([r.prompt_tokens for r in measured]),
        output_len=_pct([r.completion_tokens for r in measured]),
        cached_len=_pct([r.cached_tokens for r in measured]),
        lengths_exact=True, token_count_sources={"meta_info": len(measured)},
        request_throughput=len(measured) / window, input_tokens_per_s=sum(r.prompt_tokens for r in measured) / window,
        output_tokens_per_s=out_tokens / window, decode_tokens_per_s=1000 / 11.0,
        total_tokens_per_s=(out_tokens + sum(r.prompt_tokens for r in measured)) / window,
        goodput_rps=len(measured) / window * 0.95, goodput_fraction=0.95, sla={"ttft_ms": 500.0},
        prefix_hit_rate=sum(r.cached_tokens for r in measured) / sum(r.prompt_tokens for r in measured),
        gpu_state="ok", gpu_samples=len(samples), gpu_sample_interval_ms=interval_ms,
        gpu_mem_total_bytes=80_000_000_000, gpu_mem_peak_bytes=max(mem), gpu_mem_mean_bytes=sum(mem) / len(mem),
        gpu_mem_idle_bytes=mem[0], gpu_mem_peak_fraction=max(mem) / 80e9, gpu_util_mean=0.9,
        gpu_power_mean_w=600.0, gpu_clean_at_start=True, server_samples=2,
        # a steady window by these (fixture-sized) rules: servetune.validity
        valid=True, validity_rules=FIXTURE_RULES.model_dump(), scenario="closed_loop", offered_concurrency=concurrency,
        completions_in_window=len(measured), completions_needed=FIXTURE_RULES.completions_needed(concurrency),
        in_flight_target=float(concurrency), in_flight_mean=float(concurrency), in_flight_min=float(concurrency),
        in_flight_min_fraction=1.0, tokens_per_request=128.0, throughput_mismatch=0.0,
    )
    apply_energy(summary, {"state": "ok", "interval_ms": interval_ms, "samples": samples})  # 600 W: the power curve
    kwargs = {"trial_id": trial_id} if trial_id else {}
    return TrialResult(
        **kwargs,
        created_at=datetime.fromtimestamp(t0_unix or 1_760_000_000, UTC).isoformat(),
        stage=stage, experiment_id=experiment_id,
        target={"url": "http://127.0.0.1:30000", "endpoint": "chat", "model": model, "engine": "sglang"},
        server_config={"chunked_prefill_size": 4096, "schedule_conservativeness": 1.0},
        load={"mode": "concurrency", "concurrency": concurrency, "warmup_requests": warmup},
        sla={"p99_ttft_ms": 1000.0, "p99_tpot_ms": 50.0, "max_error_rate": 0.01},
        workload={"spec": {"name": "chat", "seed": 0, "ignore_eos": True}, "fingerprint": workload_fingerprint,
                  "lengths_exact": True},
        t0_unix=t0_unix or 1_760_000_000.0,
        records=records,
        gpu={"state": "ok", "devices": [{"index": 0, "name": "NVIDIA H100"}], "processes_at_start": [],
             "interval_ms": interval_ms, "samples": samples},
        server={"server_info": {"version": "0.5.23"}, "metrics_before": {}, "metrics_after": {},
                "samples": [{"t_s": 0.0, "name": "sglang:num_running_reqs", "labels": {"model_name": model},
                             "value": 0.0},
                            {"t_s": 1.0, "name": "sglang:num_running_reqs", "labels": {"model_name": model},
                             "value": float(concurrency)}]},
        environment={"host": "test", "servetune_version": "0.1.0"},
        summary=summary,
    )


def passing_report() -> dict:
    """A real ValidationReport of a clean trial, for seeding many trials without running GX each time."""
    from servetune.validation import validate

    return validate(make_trial(trial_id="report-template")).model_dump(mode="json")


def write_campaign(directory, experiment: dict, results: list[TrialResult]):
    """A campaign result directory as the tuning CLI writes it."""
    import orjson

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "experiment.json").write_bytes(orjson.dumps(experiment))
    for r in results:
        r.save(directory / "trials" / f"{r.trial_id}.json")
    return directory


def migrated(url: str) -> str:
    from servetune.warehouse import migrate

    migrate.upgrade(url)
    return url


@pytest.fixture(scope="module")
def wh(database_url: str):
    """The session's warehouse, migrated, as an engine for one module's tests."""
    from servetune.warehouse import db

    eng = db.engine(migrated(database_url))
    yield eng
    eng.dispose()


def scheduler_lines(*, seconds: int = 12, concurrency: int = 16, start: datetime | None = None) -> list[str]:
    """SGLang 0.5 scheduler batch lines, one prefill and one decode line a second, in the server's local time."""
    start = start or datetime(2026, 12, 1, 9, 22, 0)
    lines = [f"[{start:%Y-%m-%d %H:%M:%S}] Load weight end. type=LlamaForCausalLM"]  # not a batch line
    for s in range(seconds):
        ts = f"{datetime.fromtimestamp(start.timestamp() + s):%Y-%m-%d %H:%M:%S}"
        running, queued = min(concurrency, 4 * (s + 1)), max(0, concurrency - 4 * (s + 1))
        lines.append(f"[{ts} TP0] Prefill batch. #new-seq: 4, #new-token: {1600 + 10 * s}, #cached-token: 2400, "
                     f"token usage: {min(0.9, 0.05 + 0.04 * s):.2f}, #running-req: {running - 4}, #queue-req: {queued}")
        lines.append(f"[{ts} TP0] Decode batch. #running-req: {running}, #token: {9000 + 900 * s}, "
                     f"token usage: {min(0.91, 0.06 + 0.04 * s):.2f}, cuda graph: {s % 4 != 0}, "
                     f"gen throughput (token/s): {900.0 + 30 * s:.2f}, #queue-req: {queued}")
    return lines


def with_scheduler_log(trial: TrialResult, **kw) -> TrialResult:
    """The trial with ``server["scheduler_log"]`` and the ``sched_*`` summary, as the runner attaches them."""
    import time

    from servetune.telemetry import scheduler_log

    start = kw.pop("start", None) or datetime(2026, 12, 1, 9, 22, 0)
    rows, bad = scheduler_log.parse(scheduler_lines(start=start, **kw))
    t0 = time.mktime(start.timetuple())
    for r in rows:
        r["t_s"] = round(r.pop("t_unix") - t0, 3)
    trial.server["scheduler_log"] = {"parser": "sglang-scheduler-log", "source": "sglang-server.log", "rows": rows,
                                     "unparsed_lines": bad, "resolution_s": 1.0}
    for name, value in scheduler_log.signals(trial.server["scheduler_log"]).items():
        setattr(trial.summary, name, value)
    return trial
