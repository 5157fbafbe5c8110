"""The client's own event-loop lag (servetune.loadgen.lag): stated with every trial, and a trial whose client
was too busy to stamp its chunks on time is INVALID, whatever the server did."""

from __future__ import annotations

import asyncio
import time

from servetune.loadgen import LoadConfig, Target
from servetune.loadgen.lag import LoopLag
from servetune.trial import TrialRequest, run_trial
from servetune.validity import ValidityRules
from servetune.workload.spec import Fixed, WorkloadSpec
from test_bench_cli import sim_url  # noqa: F401  (fixture: `servetune sim serve` in its own process)


def test_a_stalled_loop_shows_in_the_lag() -> None:
    async def main() -> tuple[LoopLag, int, int]:
        lag = LoopLag()
        task = asyncio.create_task(lag.tick())
        t0 = time.perf_counter_ns()
        await asyncio.sleep(0.1)
        b0 = time.perf_counter_ns()
        time.sleep(0.06)  # the loop is busy: no tick can wake
        blocked = time.perf_counter_ns() - b0
        await asyncio.sleep(0.1)
        task.cancel()
        return lag, t0, blocked

    lag, t0, blocked = asyncio.run(main())
    p99, worst = lag.over(0.0, 1.0, t0)
    # the stall counts once, as its length: the worst tick is late by the time blocked (less the 5 ms it may
    # have been due after the stall began) plus no more than the ticker's ordinary lateness before and after it
    late_ms = sorted(x / 1e6 for x in lag._late)
    outside = late_ms[-2]  # every other tick: the ticker's lateness outside the stall
    bound = blocked / 1e6 + 2 * outside + 5
    assert 50 < worst <= bound and p99 > 10, (worst, blocked / 1e6, outside)
    assert lag.over(5.0, 6.0, t0) == (None, None)  # no tick in that span


def _trial(url: str, progress=None):
    req = TrialRequest(target=Target(url=url, endpoint="chat", timeout_s=60),
                       load=LoadConfig(concurrency=4, warmup_requests=4),
                       workload=WorkloadSpec(name="lag", seed=2, input=Fixed(value=64), output=Fixed(value=24)),
                       num_requests=40, validity=ValidityRules(min_window_s=0.5, min_completions=10))
    return run_trial(req, progress=progress)


def test_a_busy_client_makes_its_trial_invalid(sim_url) -> None:  # noqa: F811
    calm = _trial(sim_url)
    assert calm.summary.client_lag_p99_ms is not None
    # a busy machine may make even the calm client late: then, and only then, the rule refuses it too
    rule = ValidityRules().max_client_lag_ms
    calm_refused = any("event loop" in r for r in calm.summary.invalid_reasons)
    assert calm_refused == (calm.summary.client_lag_p99_ms > rule), (calm.summary.client_lag_p99_ms, rule)

    def hog(done: int, errors: int, tokens: int) -> None:
        time.sleep(0.04)  # a progress callback that blocks the loop: every stamp after it is late

    busy = _trial(sim_url, progress=hog)
    # each 40 ms stall makes a tick >= 35 ms late, on top of whatever lag the calm run had
    assert busy.summary.client_lag_p99_ms > max(30, calm.summary.client_lag_p99_ms + 20), (
        busy.summary.client_lag_p99_ms, calm.summary.client_lag_p99_ms)
    assert not busy.summary.valid
    assert any("the client's event loop woke p99" in r for r in busy.summary.invalid_reasons)
    assert busy.load["client_lag_max_ms"] >= busy.summary.client_lag_p99_ms


def test_a_load_split_over_worker_processes_is_one_load(sim_url) -> None:  # noqa: F811
    """Two client processes, each its own event loop: every request sent once, the records back in request
    order, both workers' streams interleaved in time from one start (one clock), the closed loop's 6 streams
    held between them, and the open loop's arrivals at their places in the one schedule."""
    from servetune.loadgen.workers import worker_count

    assert worker_count(64, 3) == 3 and worker_count(10_000) >= 1
    spec = WorkloadSpec(name="workers", seed=4, input=Fixed(value=64), output=Fixed(value=24))
    for load in (LoadConfig(concurrency=6, warmup_requests=6), LoadConfig(mode="rate", rate=40.0, concurrency=64,
                                                                          warmup_requests=6, exact_rate=True)):
        req = TrialRequest(target=Target(url=sim_url, endpoint="chat", timeout_s=60), load=load, workload=spec,
                           num_requests=60, validity=ValidityRules(min_window_s=0.5, min_completions=10),
                           client_workers=2)
        t = run_trial(req)
        assert t.status == "ok" and t.load["client_workers"] == 2, t.failure_reason
        assert [r.request_id for r in t.records] == list(range(66))
        assert sum(r.warmup for r in t.records) == 6 and t.summary.requests_ok == 60
        sends = [r.t_send_s for r in t.records]
        assert max(sends[:2]) - min(sends[:2]) < 0.2  # worker 0's and worker 1's first requests start together
        if load.mode == "rate":  # the one schedule, kept: arrivals 1/40 s apart on average, alternating workers
            assert abs(t.summary.scheduled_rate - 40.0) / 40.0 < 0.1 and t.summary.dispatch_fraction > 0.95
        else:
            assert t.summary.valid, t.summary.invalid_reasons
            assert t.summary.in_flight_mean > 5.0
