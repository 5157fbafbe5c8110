"""Priming the prefix cache before a trial (servetune/loadgen/priming.py): one short request per shared part,
sent before the trial's clock, in virtual time and against the simulated server over real HTTP."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from aiohttp.test_utils import TestServer

from servetune.loadgen import LoadConfig, Target
from servetune.loadgen.priming import PRIMER_INDEX, primers, primers_for, shared_segments
from servetune.sim import server_args_from_flags, simulate
from servetune.sim.server import SimServer
from servetune.trial import TrialRequest, run_trial
from servetune.workload import build_requests
from servetune.workload.spec import Fixed, Images, SharedPrefix, Uniform, WorkloadSpec

VLM = "llava-8b"


def _vlm_spec(position: str = "before_text", reuse: float = 1.0) -> WorkloadSpec:
    return WorkloadSpec(input=Uniform(min=100, max=300), output=Uniform(min=16, max=48), seed=3,
                        shared_prefix=SharedPrefix(tokens=200, num_prefixes=2, share_ratio=0.9),
                        images=Images(count=1, width=336, height=336, ratio=0.7, distinct=8, reuse_ratio=reuse,
                                      position=position))


def _heads(reqs: list) -> set:
    """Every request's shared head (system prompt, leading pooled images)."""
    return {segs for r in reqs if (segs := shared_segments(r))}


def test_one_primer_per_shared_head_in_order_of_first_use() -> None:
    reqs = build_requests(_vlm_spec(), 200).requests
    first = primers(reqs)
    heads = [shared_segments(p) for p in first]
    assert len(set(heads)) == len(heads) and set(heads) <= _heads(reqs)
    begins = [shared_segments(r) for r in reqs]
    for segs in begins:  # every request's head is primed as far as another request shares it
        k = max((k for k in range(1, len(segs) + 1) if sum(b[:k] == segs[:k] for b in begins) >= 2), default=0)
        assert any(h[:k] == segs[:k] for h in heads) if k else True
    assert any(len(h) == 2 for h in heads)  # system prompt and image, primed together
    assert [p.index for p in first] == list(range(PRIMER_INDEX, PRIMER_INDEX + len(first)))
    assert all(p.output_tokens == 1 and p.history == [] and p.conversation == -1 for p in first)
    order = list(dict.fromkeys(shared_segments(r) for r in reqs if shared_segments(r) in set(heads)))
    assert heads == order


def test_images_after_the_text_or_unique_ones_share_nothing_but_the_system_prompt() -> None:
    after = build_requests(_vlm_spec("after_text"), 100).requests
    assert {p.images == [] and p.system is not None for p in primers(after)} == {True}
    unique = build_requests(_vlm_spec(reuse=0.0), 100).requests
    assert all(r.pooled_images == 0 for r in unique) and all(p.images == [] for p in primers(unique))
    ahead = build_requests(_vlm_spec("before_system", reuse=0.5), 200).requests
    for r in ahead:  # an unpooled image ahead of the system prompt: nothing after it is shared
        segs = shared_segments(r)
        assert [k for k, _ in segs] == ["image"] * r.pooled_images + (["system"] * (r.system is not None)
                                                                       if r.pooled_images == len(r.images) else [])


def test_a_head_no_other_request_shares_is_not_primed() -> None:
    """A nonce inside the system prompt: every prompt differs from its first words, nothing to warm."""
    reqs = build_requests(_vlm_spec().model_copy(update={"images": None}), 60).requests
    own = [replace(r, system=f"nonce {r.index}. {r.system}") if r.system else r for r in reqs]
    assert primers(own) == [] and len(primers(reqs)) == 2  # the two real system prompts


def test_a_trace_or_a_load_that_says_so_is_not_primed() -> None:
    reqs = build_requests(_vlm_spec(), 50).requests
    assert primers_for(reqs, LoadConfig(concurrency=4, prime_cache=False)) == []
    assert primers_for(reqs, LoadConfig(mode="rate", arrival="trace", concurrency=4)) == []
    assert primers_for(reqs, LoadConfig(concurrency=4, warmup_requests=10)) == primers(reqs[10:], reqs)


def _missed(records: list) -> int:
    """Measured requests with a shared part that the cache did not hold (fewer cached tokens than the prefix)."""
    return sum(1 for r in records if not r.warmup and r.prefix_group >= 0 and (r.cached_tokens or 0) < 200)


def test_a_primed_virtual_trial_meets_no_first_use_and_its_records_hold_no_primer() -> None:
    reqs = build_requests(_vlm_spec(), 140).requests
    args = {"model_profile": VLM, "enable_cache_report": True}
    load = LoadConfig(concurrency=8, warmup_requests=4)
    cold = simulate(args, reqs, load.model_copy(update={"prime_cache": False}))
    warm = simulate(args, reqs, load)
    n = len(primers(reqs[4:], reqs))
    assert cold.load["primers"] == 0 and warm.load["primers"] == n > 4
    assert len(warm.records) == len(cold.records) == 140  # the primers are not records of the trial
    assert all(r.request_id < PRIMER_INDEX for r in warm.records)
    assert _missed(cold.records) > 0 and _missed(warm.records) == 0
    assert min(r.t_send_s for r in warm.records) > 0  # the trial's clock starts once the primers are done
    assert min(s["t_s"] for s in warm.gpu["samples"]) >= min(r.t_send_s for r in warm.records) - 0.1


async def test_a_live_trial_primes_the_server_before_its_clock_starts() -> None:
    sim = SimServer(server_args_from_flags({"load_seconds": 0.0, "model_profile": VLM, "enable_cache_report": True,
                                            "enable_metrics": True}))
    server = TestServer(sim.app, host="127.0.0.1", port=0)
    await server.start_server()
    await asyncio.sleep(0.01)
    spec = _vlm_spec().model_copy(update={"output": Fixed(value=4)})
    req = TrialRequest(target=Target(url=f"http://127.0.0.1:{server.port}", endpoint="chat"),
                       load=LoadConfig(concurrency=4, warmup_requests=2), workload=spec, num_requests=40)
    try:
        result = await asyncio.to_thread(run_trial, req)
    finally:
        await server.close()
    batch = build_requests(spec, 42).requests
    n = len(primers(batch[2:], batch))
    assert result.status == "ok" and result.load["primers"] == n and result.load["primer_errors"] == 0
    assert len(result.records) == 42 and all(r.request_id < PRIMER_INDEX for r in result.records)
    assert _missed(result.records) == 0  # every measured request found its system prompt cached
