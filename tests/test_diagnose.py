"""Diagnoses (servetune.diagnose) on data whose answer is known: synthetic curves and records, simulator
scenarios built to trigger each rule, and the recorded H200 trials (tests/data/gpu-h200*, real NVML)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
import pytest

from servetune.diagnose import diagnose_dir, diagnose_trial, interference, memory, prefix_cache, queue
from servetune.loadgen.config import LoadConfig
from servetune.records import RequestRecord
from servetune.result import TrialResult, TrialSummary
from servetune.sim.virtual import simulate
from servetune.workload import build_requests
from servetune.workload.request import WorkloadRequest
from servetune.workload.spec import Fixed, Images, Mixture, MixturePart, SharedPrefix, WorkloadSpec

REPO = Path(__file__).resolve().parent.parent
H200 = REPO / "tests" / "data" / "gpu-h200-sglang"
GB = 1e9


def kinds(findings, family: str) -> list[str]:
    return [f.kind for f in findings if f.kind.startswith(family + ".")]


def one(findings, kind: str):
    (f,) = [f for f in findings if f.kind == kind]
    return f


# --- rule 1: the memory curve -------------------------------------------------------------------

def curve_trial(mem_gb: np.ndarray, *, total_gb: float = 80.0, gpus: int = 1, **kw) -> TrialResult:
    """A trial holding only a GPU curve (each GPU reads mem/gpus), 100 ms apart."""
    samples = [{"t_s": 0.1 * k, "gpu": g, "mem_used": int(m * GB / gpus), "mem_total": int(total_gb * GB / gpus),
                "util": 50.0, "power_w": 300.0} for k, m in enumerate(mem_gb) for g in range(gpus)]
    return TrialResult(trial_id="curve", gpu={"state": "ok", "samples": samples}, **kw)


def test_memory_shapes_on_synthetic_curves() -> None:
    t = np.arange(300)
    start = np.concatenate([np.linspace(5, 60, 10), np.full(290, 60.0)])  # start-up allocation, then flat
    plateau = memory.diagnose(curve_trial(start + 0.01 * np.sin(t), server_config={"mem-fraction-static": 0.75}))
    assert one(plateau, "memory.plateau").evidence["level_fraction"] == pytest.approx(0.75, abs=0.01)
    assert "normal pooling" in plateau[0].summary
    saw = memory.diagnose(curve_trial(60 + 1.5 * (t % 20 < 5), server_config={"chunked_prefill_size": 16384}, gpus=2))
    f = one(saw, "memory.sawtooth")
    assert f.evidence["teeth"] >= 10 and "--chunked-prefill-size (now 16384)" in f.advice
    rise = memory.diagnose(curve_trial(np.linspace(20, 78, 300) + 0.05 * np.sin(t)))
    f = one(rise, "memory.smooth_rise")
    assert f.severity == "critical" and "--max-running-requests" in f.advice  # 78 of 80 GB: at the limit
    # out of memory at 50% of the GPU with a 0.85 reserve: fragmentation or a wrong reserve
    crash = np.concatenate([np.linspace(30, 40, 150), np.full(150, 0.5)])
    early = memory.diagnose(curve_trial(crash, server_config={"mem_fraction_static": 0.85}))
    assert kinds(early, "memory") == ["memory.early_oom"] and "lower --mem-fraction-static" in early[0].advice
    high = np.concatenate([np.linspace(40, 79, 150), np.full(150, 0.5)])
    assert kinds(memory.diagnose(curve_trial(high)), "memory") == ["memory.rise_to_oom"]
    assert kinds(memory.diagnose(TrialResult(gpu={"state": "no_gpu", "samples": []})), "memory") == ["memory.no_curve"]


def test_memory_on_the_simulators_curve_sawtooth_with_big_chunks_plateau_with_small() -> None:
    spec = WorkloadSpec(seed=1, output=Fixed(value=64), input=Mixture(parts=[
        MixturePart(weight=0.85, dist=Fixed(value=256)), MixturePart(weight=0.15, dist=Fixed(value=16000))]))
    reqs = build_requests(spec, 200).requests
    load = LoadConfig(concurrency=16, warmup_requests=16)
    big = simulate({"chunked_prefill_size": 16384}, reqs, load)
    small = simulate({"chunked_prefill_size": 512}, reqs, load)
    assert kinds(diagnose_trial(big), "memory") == ["memory.sawtooth"]  # 16k-token prefills: ~1.6 GB transients
    f = one(diagnose_trial(small), "memory.plateau")
    assert f.evidence["simulated"] is True and "normal pooling" in f.summary
    # rule 2 on the same run: decodes wait out every long prefill (no mixed chunks in the sim, as SGLang's default)
    f = one(diagnose_trial(big), "interference.long_prefill")
    assert f.evidence["slowdown"] > 5 and f.severity == "critical" and "--enable-mixed-chunk" in f.advice


def test_memory_on_real_h200_nvml_curves() -> None:
    """SGLang preallocates: a flat curve at its pool's level; the older vLLM-style run has a start-up step."""
    bench = TrialResult.read(REPO / "tests" / "data" / "gpu-h200" / "bench-c32.json")
    f = one(diagnose_trial(bench), "memory.plateau")
    assert f.evidence["level_fraction"] == pytest.approx(0.317, abs=0.01) and f.evidence["simulated"] is False
    assert f.evidence["start_gb"] < 5 < f.evidence["peak_gb"]  # the start-up allocation is left out of the shape
    (trial,) = (H200 / "tune-a" / "trials").glob("*.json")
    f = one(diagnose_trial(TrialResult.read(trial)), "memory.plateau")
    assert f.evidence["mem_fraction_static"] == 0.8 and "normal pooling" in f.summary
    assert f.evidence["settled_range_fraction"] < 0.005  # NVML noise is far under a sawtooth's tooth


# --- rule 2: interference -----------------------------------------------------------------------

def _rec(i: int, t: float, prompt: int, ttft: float, gaps: list[float]) -> RequestRecord:
    offs = list(ttft + np.cumsum([0.0, *gaps]))
    return RequestRecord(request_id=i, t_send_s=t, ttft_ms=ttft, e2e_ms=offs[-1], chunk_offsets_ms=offs,
                         chunk_tokens=[1] * len(offs), prompt_tokens=prompt, completion_tokens=len(offs))


def test_interference_on_synthetic_records_slow_gaps_only_during_long_prefills() -> None:
    """Shorts decode at 10 ms/token except while a long prompt's prefill (send -> first token) runs: 60 ms."""
    records, i = [], 0
    for k in range(10):  # a long prompt every 2 s, its prefill [2k, 2k + 0.5]
        records.append(_rec(i, 2.0 * k, 12000, 500.0, [10.0] * 4))
        i += 1
    for k in range(40):
        t = 0.5 * k
        gaps = [60.0 if (t + 0.05 + 0.01 * j) % 2.0 < 0.5 else 10.0 for j in range(30)]
        records.append(_rec(i, t, 300, 50.0, gaps))
        i += 1
    trial = TrialResult(trial_id="itl", records=records, server_config={"chunked_prefill_size": 8192})
    found = interference.diagnose(trial)
    f = one(found, "interference.long_prefill")
    assert f.evidence["slowdown"] == pytest.approx(6.0, rel=0.05) and f.evidence["itl_p50_outside_ms"] == 10.0
    assert "now 8192" in f.advice
    table = one(found, "interference.by_input_length").evidence["buckets"]
    assert [b["bucket"] for b in table] == ["0-1k", "4k-16k"] and table[1]["ttft_p50_ms"] == 500.0
    # the same requests with steady decodes: no interference
    calm = [_rec(r.request_id, r.t_send_s, r.prompt_tokens, r.ttft_ms, [10.0] * (len(r.chunk_offsets_ms) - 1))
            for r in records]
    assert kinds(interference.diagnose(TrialResult(records=calm)), "interference") == [
        "interference.by_input_length", "interference.none"]


# --- rule 3: the prefix-cache audit -------------------------------------------------------------

def _words(rng: np.random.Generator, n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in rng.integers(0, 50_000, n))


def _shared_prefix_requests(nonce: bool) -> list[WorkloadRequest]:
    rng = np.random.default_rng(0)
    shared = _words(rng, 1500)
    return [WorkloadRequest(index=i, system=(f"request {i} nonce {rng.integers(1 << 30)}. " if nonce else "") + shared,
                            user=_words(rng, 150, "u"), input_tokens=1700, output_tokens=32, prefix_group=0)
            for i in range(100)]


def test_prefix_cache_audit_names_a_nonce_ahead_of_the_shared_prefix() -> None:
    spec = WorkloadSpec(input=Fixed(value=1700), output=Fixed(value=32), shared_prefix=SharedPrefix(tokens=1500))
    load = LoadConfig(concurrency=8, warmup_requests=8)
    out = {}
    for nonce in (False, True):
        r = simulate({"enable_cache_report": True}, _shared_prefix_requests(nonce), load)
        r.workload = {"spec": spec.model_dump(mode="json")}  # what the spec promised: 1500 shared tokens
        out[nonce] = prefix_cache.diagnose(r)
    f = one(out[False], "prefix_cache.effective")
    assert f.evidence["cached_of_shareable"] > 0.95 and f.evidence["expected_hit_rate"] == pytest.approx(0.88, abs=0.03)
    f = one(out[True], "prefix_cache.not_effective")
    assert f.evidence["cached_of_shareable"] < 0.05 and "nonce" in f.evidence["likely_cause"]
    assert "after the shared prefix" in f.advice


@pytest.mark.parametrize("position,kind", [("before_system", "prefix_cache.not_effective"),
                                           ("before_text", "prefix_cache.effective")])
def test_prefix_cache_audit_images_before_the_system_prompt(position: str, kind: str) -> None:
    spec = WorkloadSpec(seed=3, input=Fixed(value=1200), output=Fixed(value=16), shared_prefix=SharedPrefix(tokens=800),
                        images=Images(count=1, width=64, height=64, position=position))
    r = simulate({"enable_cache_report": True, "model_profile": "llava-8b"}, build_requests(spec, 60).requests,
                 LoadConfig(concurrency=8, warmup_requests=8))
    r.workload = {"spec": spec.model_dump(mode="json")}
    f = one(prefix_cache.diagnose(r), kind)
    if kind.endswith("not_effective"):
        assert "images.position: before_system" in f.evidence["likely_cause"]
    else:
        assert f.evidence["cached_of_shareable"] > 0.9


def test_prefix_cache_eviction_high_usage_with_falling_hits() -> None:
    """Synthetic: 600-token shared prefix, the cached share falls from all to a fifth over the window, pool 97% full."""
    records = [RequestRecord(request_id=i, t_send_s=0.1 * i, ttft_ms=50.0, e2e_ms=500.0, prompt_tokens=1000,
                             completion_tokens=64, cached_tokens=int(600 * (1.0 - 0.8 * i / 89)), prefix_group=0)
               for i in range(90)]
    summary = TrialSummary(server_token_usage_max=0.97, prefix_hit_rate=0.36)
    trial = TrialResult(records=records, summary=summary,
                        workload={"spec": {"shared_prefix": {"tokens": 600, "share_ratio": 1.0}}})
    found = prefix_cache.diagnose(trial)
    f = one(found, "prefix_cache.eviction")
    assert f.evidence["hit_first_third"] > 0.8 > 0.4 > f.evidence["hit_last_third"]
    # the same fall with a pool a third full is not eviction
    trial.summary = TrialSummary(server_token_usage_max=0.3, prefix_hit_rate=0.36)
    assert "prefix_cache.eviction" not in kinds(prefix_cache.diagnose(trial), "prefix_cache")


def test_multi_turn_history_is_shareable() -> None:
    """A later turn can reuse its predecessor's prompt and answer: 1000 + 100 of each 1200-token second turn."""
    records = []
    for s in range(12):
        records.append(RequestRecord(request_id=2 * s, t_send_s=s, prompt_tokens=1000, completion_tokens=100,
                                     cached_tokens=0, session=s, turn=0, ttft_ms=1.0, e2e_ms=2.0))
        records.append(RequestRecord(request_id=2 * s + 1, t_send_s=s + 0.5, prompt_tokens=1200, completion_tokens=100,
                                     cached_tokens=1090, session=s, turn=1, ttft_ms=1.0, e2e_ms=2.0))
    assert prefix_cache.shareable(records, {})[:2] == [0, 1100]
    f = one(prefix_cache.diagnose(TrialResult(records=records, summary=TrialSummary(prefix_hit_rate=0.5))),
            "prefix_cache.effective")
    assert f.evidence["cached_of_shareable"] == pytest.approx(1090 / 1100, abs=1e-3)


def test_real_h200_campaign_cache_is_effective_and_the_queue_is_not_memory(tmp_path) -> None:
    """tune-b on SGLang 0.5.17: a 256-token prefix on 80% of requests is served from cache (23% of prompt tokens,
    as the spec predicts); at 128 streams requests queue with the KV pool 13% full: admission, not memory."""
    with tarfile.open(H200 / "tune-b.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data")
    found = diagnose_dir(tmp_path / "tune-b")
    effective = [f for f in found if f.kind == "prefix_cache.effective"]
    assert len(effective) >= 15 and all(f.evidence["cached_of_shareable"] > 0.95 for f in effective)
    assert all(abs(f.evidence["expected_hit_rate"] - f.evidence["prefix_hit_rate"]) < 0.03 for f in effective)
    assert not [f for f in found if f.severity != "info"]  # a healthy server: nothing to flag
    busy = [f for f in found if f.kind == "queue.admission_bound" and f.evidence["queue_reqs_mean"] > 15]
    assert busy and all(f.evidence["token_usage_max"] < 0.2 for f in busy)


# --- rule 5: queue, retractions, rejections -----------------------------------------------------

def test_retractions_at_low_conservativeness_with_a_small_pool_in_the_simulator() -> None:
    rng = np.random.default_rng(0)
    reqs = [WorkloadRequest(index=i, system=None, user=_words(rng, 500), input_tokens=500, output_tokens=600)
            for i in range(96)]
    r = simulate({"schedule_conservativeness": 0.3, "max_total_tokens": 20_000}, reqs, LoadConfig(concurrency=32),
                 endpoint="completions")
    found = queue.diagnose(r)
    f = one(found, "queue.retractions")
    assert f.evidence["retractions"] > 0 and "--schedule-conservativeness (now 0.3)" in f.advice
    assert "queue.memory_bound" in kinds(found, "queue")  # the pool, not the cap, held the queue


def test_rejections_and_a_quiet_queue() -> None:
    summary = TrialSummary(requests_measured=100, errors_by_class={"rejected_503": 10}, server_queue_reqs_mean=0.2)
    f = one(queue.diagnose(TrialResult(summary=summary)), "queue.rejections")
    assert f.severity == "critical" and f.evidence["rejected_share"] == 0.1
    quiet = queue.diagnose(TrialResult(summary=TrialSummary(server_queue_reqs_mean=0.1, server_token_usage_max=0.2)))
    assert kinds(quiet, "queue") == ["queue.none"]
