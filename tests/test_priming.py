"""Priming the prefix cache before a trial (servetune/loadgen/priming.py): one short request per shared part,
sent before the trial's clock, in virtual time and against the simulated server over real HTTP."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestServer

from servetune.loadgen import LoadConfig, Target
from servetune.loadgen.priming import PRIMER_INDEX, primers, primers_for, shared_part
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


def test_one_primer_per_shared_part_in_order_of_first_use() -> None:
    reqs = build_requests(_vlm_spec(), 200).requests
    first = primers(reqs)
    parts = {shared_part(r) for r in reqs} - {(None, ())}
    assert len(first) == len(parts) and {shared_part(p) for p in first} == parts  # each once, all of them
    assert [p.index for p in first] == list(range(PRIMER_INDEX, PRIMER_INDEX + len(first)))
    assert all(p.output_tokens == 1 and p.history == [] and p.conversation == -1 for p in first)
    order = list(dict.fromkeys(k for r in reqs if (k := shared_part(r)) != (None, ())))
    assert [shared_part(p) for p in first] == order


def test_images_after_the_text_or_unique_ones_share_nothing_but_the_system_prompt() -> None:
    after = build_requests(_vlm_spec("after_text"), 100).requests
    assert {shared_part(p)[1] for p in primers(after)} == {()}  # the user's text comes first: images never shared
    unique = build_requests(_vlm_spec(reuse=0.0), 100).requests
    assert all(r.pooled_images == 0 for r in unique) and {shared_part(p)[1] for p in primers(unique)} == {()}
    ahead = build_requests(_vlm_spec("before_system", reuse=0.5), 200).requests
    for r in ahead:  # an unpooled image ahead of the system prompt: nothing after it is shared
        assert shared_part(r) == ((r.system, tuple(r.images)) if r.pooled_images == len(r.images)
                                  else (None, tuple(r.images[: r.pooled_images])))


def test_a_trace_or_a_load_that_says_so_is_not_primed() -> None:
    reqs = build_requests(_vlm_spec(), 50).requests
    assert primers_for(reqs, LoadConfig(concurrency=4, prime_cache=False)) == []
    assert primers_for(reqs, LoadConfig(mode="rate", arrival="trace", concurrency=4)) == []
    assert len(primers_for(reqs, LoadConfig(concurrency=4, warmup_requests=10))) == len(primers(reqs[10:]))


def _missed(records: list) -> int:
    """Measured requests with a shared part that the cache did not hold (fewer cached tokens than the prefix)."""
    return sum(1 for r in records if not r.warmup and r.prefix_group >= 0 and (r.cached_tokens or 0) < 200)


def test_a_primed_virtual_trial_meets_no_first_use_and_its_records_hold_no_primer() -> None:
    reqs = build_requests(_vlm_spec(), 140).requests
    args = {"model_profile": VLM, "enable_cache_report": True}
    load = LoadConfig(concurrency=8, warmup_requests=4)
    cold = simulate(args, reqs, load.model_copy(update={"prime_cache": False}))
    warm = simulate(args, reqs, load)
    n = len(primers(reqs[4:]))
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
    n = len(primers(build_requests(spec, 42).requests[2:]))
    assert result.status == "ok" and result.load["primers"] == n and result.load["primer_errors"] == 0
    assert len(result.records) == 42 and all(r.request_id < PRIMER_INDEX for r in result.records)
    assert _missed(result.records) == 0  # every measured request found its system prompt cached
