"""An engine that answers without end, each way one stream can: every such request fails at its own bound with
its own class, long before its timeout, while the other streams finish (issue 44; docs/reliability.md, "Inputs
from outside are bounded"). Both HTTP clients: the raw one a load uses by default and aiohttp (https targets)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from servetune.loadgen import LoadConfig, Target, run_load
from servetune.workload import build_requests
from servetune.workload.spec import Fixed, WorkloadSpec
from sse_server import Scenario, SseServer

#: the way a stream never ends -> (the class of its request, words of its message), per client
EXPECTED = {
    "endless": {"raw": ("response_too_large", "passed 128 MiB"), "aiohttp": ("response_too_large", "passed 128 MiB")},
    "endless_event": {"raw": ("response_too_large", "passed 128 MiB"),
                      "aiohttp": ("response_too_large", "passed 128 MiB")},
    "deep_json": {"raw": ("response_too_large", "passed 128 MiB"), "aiohttp": ("response_too_large", "passed 128 MiB")},
    "endless_error": {"raw": ("http_5xx", "HTTP 500"), "aiohttp": ("http_5xx", "HTTP 500")},
    "endless_headers": {"raw": ("connection", "no end of headers"), "aiohttp": ("client_error", "Too many headers")},
}


@pytest.mark.parametrize("client", ["raw", "aiohttp"])
async def test_every_answer_without_end_fails_at_its_bound_with_its_class(client: str) -> None:
    kinds = list(EXPECTED)
    fail = {1 + 3 * i: kind for i, kind in enumerate(kinds)}  # requests 1, 4, 7, 10, 13 of 15
    timeout_s = 60.0
    reqs = build_requests(WorkloadSpec(input=Fixed(value=32), output=Fixed(value=8)), 15).requests
    # the prompt names its failure, so the server fails that request whatever order the streams arrive in
    reqs = [replace(q, user=f"{q.user} [fail:{fail[q.index]}]") if q.index in fail else q for q in reqs]
    async with SseServer(Scenario(ttft_ms=5, gap_ms=5)) as srv:
        t = time.monotonic()
        out = await run_load(Target(url=srv.url, http_client=client, timeout_s=timeout_s), reqs,
                             LoadConfig(concurrency=3, prime_cache=False), t0_ns=time.perf_counter_ns())
        took = time.monotonic() - t
        wrote = srv.endless_bytes
    failed = sorted((r for r in out.records if not r.ok), key=lambda r: r.request_id)
    assert [r.request_id for r in failed] == sorted(fail), [(r.request_id, r.error_class) for r in failed]
    for r, kind in zip(failed, kinds, strict=True):
        cls, words = EXPECTED[kind][client]
        assert r.error_class == cls and words in (r.error_message or ""), (kind, r.error_class, r.error_message)
    assert sum(r.ok for r in out.records) == 10
    # the bounds ended them, not the timeout; the engine wrote more than the client kept
    assert took < timeout_s and wrote > 3 * (128 << 20)
