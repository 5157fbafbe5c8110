"""A short real campaign against vLLM on the CPU: the knobs max-num-seqs and max-num-batched-tokens.

The same LiveTrialRunner a GPU campaign uses: servetune.runners.provision starts vLLM (local runner)
with each trial's knobs, restarts it on every change, and servetune.trial.run_trial measures each
level. Kept small because every vLLM start costs about a minute on the CPU: two or three server starts
(the ramp's config, max-num-batched-tokens 1024, max-num-seqs = the level unless it already is).
Which level is the ceiling depends on the CPU's timing, so the checks follow the walk, not a number.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from servetune.plan import parse_plan
from servetune.result import TrialResult
from servetune.tuning.campaign import Campaign
from servetune.tuning.live import LiveTrialRunner
from vllm_cpu import VllmCpuEnv, vllm_cpu_env  # noqa: F401 - the session fixture (tests/vllm_cpu.py)

#: the checklist items a loaded 2-core box breaks, engine and client sharing it: a trial they reject is re-run
LOAD_BOUND = {"steady_window", "window_completions", "in_flight_level"}
pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.mark.timeout(1500)
def test_vllm_cpu_campaign_tunes_max_num_seqs_and_batched_tokens(vllm_cpu_env: VllmCpuEnv, tmp_path: Path) -> None:  # noqa: F811
    env = vllm_cpu_env
    plan = parse_plan({
        "name": "vllm-cpu-tiny", "model": str(env.model_path),
        "engine": {
            "kind": "vllm", "python": str(env.python), "served_model_name": "tiny", "dtype": "bfloat16",
            "max_model_len": 2048, "enforce_eager": True, "enable_prefix_caching": True, "ready_timeout_s": 600,
            "max_num_seqs": 2, "max_num_batched_tokens": 512,
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(env.home / "cache")},
        },
        "runner": {"kind": "local", "grace_s": 15},
        "endpoint": "completions",
        "workload": {"seed": 5, "tokenizer": str(env.model_path),
                     "input": {"kind": "uniform", "min": 64, "max": 192}, "output": {"kind": "fixed", "value": 12},
                     "shared_prefix": {"tokens": 136, "share_ratio": 1.0}},
        "sla": {"p99_e2e_ms": 60000, "max_error_rate": 0.0},
        "stages": {
            "correctness": {"requests": 1},
            "baseline": {"concurrency": 2, "requests": 60, "warmup": 1},
            "ramp": {"levels": [4], "requests": 80, "warmup": 1, "bisect": False},
            "refine": {"grid": {"max-num-batched-tokens": [1024]}, "max_running_flag": "max-num-seqs",
                       "extend_levels": 0},
        },
        "budget": {"max_gpu_minutes": 30},
        # a CPU engine: short steady windows, one trial per decision (the test is about the knobs)
        # the engine shares the 2 cores with the client: a 1 s window of 2 streams shows its hiccups, and the
        # client's loop wakes late behind the engine's threads (tens of ms, 500 seen on a slow box; the test is not
        # about TTFT)
        # the checklist runs on every trial as it finishes: a CPU engine has no GPU memory curve to check, and
        # its trials measure tens of requests, not the GPU default of 200
        "validation": {"min_window_s": 1.0, "min_completions": 6, "completions_per_stream": 1, "min_in_flight": 0.75,
                       "max_client_lag_ms": 2000, "min_measured": 20, "waive": ["gpu_memory_curve", "clean_gpu"]},
        "repeats": {"count": 1, "invalid_retries": 2},  # a 1 s window on a loaded 2-core box can miss once
    }, source="vllm-cpu plan")
    campaign = Campaign(plan, LiveTrialRunner(plan, log_dir=tmp_path / "logs"), tmp_path / "out")
    decision = campaign.run()
    assert decision.done and not decision.failed, decision.reason

    trials = sorted((TrialResult.read(p) for p in (tmp_path / "out" / "trials").glob("*.json")),
                    key=lambda t: t.created_at)
    # nothing failed; a trial the checklist rejected (a 1 s window on a loaded 2-core box) is re-run, like an INVALID
    # one
    assert all(t.status in ("ok", "rejected") for t in trials), [t.failure_reason for t in trials]
    # ... and only by the items a starved client or engine breaks: the steady window and what it holds, the
    # client holding its streams (a fresh-clone run saw 1.82 of 2 in flight on a refine trial)
    rejected = {t.trial_id: set(re.findall(r"\[(\w+): ", t.failure_reason or "")) for t in trials
                if t.status == "rejected"}
    assert all(items and items <= LOAD_BOUND for items in rejected.values()), rejected
    stages = [t.stage for t in trials]
    runs = [st for i, st in enumerate(stages) if i == 0 or st != stages[i - 1]]  # an INVALID trial is re-run
    assert runs[:3] == ["correctness", "baseline", "ramp"]
    # an INVALID or rejected trial (a 2-core box shared with the engine can starve the client) is re-run
    for t in trials:
        if t.stage != "correctness" and (t.summary.valid is False or t.status == "rejected"):
            same = [u for u in trials if u.load["concurrency"] == t.load["concurrency"]
                    and u.server_config == t.server_config]
            later = [u for u in same if u.created_at > t.created_at]
            assert (later and later[0].load["requests"] > t.load["requests"]) or len(same) == 1 + 2, \
                t.summary.invalid_reasons  # re-run bigger, or the attempts (1 + invalid_retries) are used up
    refine = [t for t in trials if t.stage == "refine"]
    base = {"max-num-seqs": 2, "max-num-batched-tokens": 512, "enable-prefix-caching": True}
    assert all(t.server_config == base for t in trials if t.stage != "refine")
    # the walk: max-num-batched-tokens first, then max-num-seqs = the level (skipped when it already is)
    level = decision.ceiling.level
    assert refine[0].server_config == {**base, "max-num-batched-tokens": 1024}
    # at the ceiling; a tie there is also tried one ramp level up (max-num-seqs 2 often makes 4 a plateau). The
    # ceiling can also move down once the ramp's levels get their seeds (a 2-core box's noise: 4 gained too little
    # over 2 beyond it), after the walk began at 4: those first trials are stale, the walk restarted at the level
    first_here = next((i for i, t in enumerate(refine) if t.load["concurrency"] == level), len(refine))
    stale, refine = refine[:first_here], refine[first_here:]
    assert all(t.load["concurrency"] > level for t in stale), [t.load["concurrency"] for t in stale]
    tied_up = [t for t in refine if t.load["concurrency"] != level]
    if tied_up:
        assert {t.load["concurrency"] for t in tied_up} == {4} and level == 2
        # the candidate climbed: it lost or tied up there (the tie kept), or it held 4 where the incumbent did not
        assert any("a tie within the noise at concurrency 2" in line or "a tie at concurrency 2, but it holds"
                   " concurrency 4" in line for line in decision.recommendation.explanation), \
            (decision.reason, "\n".join(decision.recommendation.explanation),
             [(t.stage, t.load["concurrency"], t.server_config, t.status, t.summary.goodput_rps) for t in trials])
    won_up = any("but it holds concurrency 4" in line for line in decision.recommendation.explanation)
    refine = [t for t in refine if t not in tied_up]
    seqs_tried = {t.server_config["max-num-seqs"] for t in refine}
    assert seqs_tried == ({2, level} if level != 2 else {2})

    # the knobs reached vLLM: one server per run of equal flags, each logging the args it was launched with
    changes = 1 + sum(a.server_config != b.server_config for a, b in zip(trials, trials[1:], strict=False))
    logs = [p.read_text(errors="replace") for p in (tmp_path / "logs").glob("vllm-*.log")]
    assert len(logs) == changes
    args = [next(line for line in log.splitlines() if "non-default args" in line) for log in logs]
    assert any("'max_num_batched_tokens': 512" in a and "'max_num_seqs': 2" in a for a in args)
    assert any("'max_num_batched_tokens': 1024" in a for a in args)
    # every measured request came back with the output length asked for, through the real engine
    for t in trials[1:]:
        assert t.summary.requests_failed == 0 and t.summary.requests_ok == t.summary.requests_measured
        assert t.summary.output_len.min == 12
    rec = json.loads((tmp_path / "out" / "recommendation.json").read_text())
    assert rec["concurrency"] == (4 if won_up else level) and rec["goodput_rps"] > 0
    assert rec["evidence_trial_ids"][0] in {t.trial_id for t in trials}
    assert rec["prefix_hit_rate"] is not None  # vLLM reports cached tokens with a shared prefix
