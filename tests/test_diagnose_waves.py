"""Static (waves) against continuous batching on one server: the ``waves`` load mode, its steady-window
rule, ``servetune bench --waves`` against the simulated SGLang server, and the comparison finding."""

from __future__ import annotations

import asyncio
import time

import orjson
from typer.testing import CliRunner

from servetune.cli import app
from servetune.diagnose import diagnose_dir
from servetune.loadgen.strategies import waves
from servetune.records import RequestRecord
from servetune.validity import ValidityRules, assess, steady_window
from test_bench_cli import sim_url  # noqa: F401  (fixture: `servetune sim serve` in its own process)


def test_waves_send_the_next_batch_only_when_the_last_is_done() -> None:
    log: list[tuple[str, int, float]] = []

    async def send(i: int, queue_ns: int) -> None:
        log.append(("start", i, time.perf_counter()))
        await asyncio.sleep(0.01 * (1 + i % 3))
        log.append(("end", i, time.perf_counter()))

    asyncio.run(waves(list(range(10)), 4, send))
    starts = [i for kind, i, _ in log if kind == "start"]
    assert starts[:4] == [0, 1, 2, 3] and sorted(starts) == list(range(10))
    # wave k starts after every request of wave k-1 ended
    t = {(kind, i): at for kind, i, at in log}
    for first, _last in ((4, 3), (8, 7)):
        assert min(t[("start", j)] for j in range(first, first + 4) if j < 10) >= max(
            t[("end", j)] for j in range(first - 4, first))


def test_the_waves_window_spans_every_wave_and_has_no_in_flight_rule() -> None:
    """Three waves of 4 (the first warm-up) of 1 s each: the window is the last two waves, whole."""
    records = [RequestRecord(request_id=4 * w + k, t_send_s=float(w), e2e_ms=400.0 + 200.0 * k, completion_tokens=10,
                             warmup=w == 0) for w in range(3) for k in range(4)]
    win = steady_window(records, {"mode": "waves", "concurrency": 4})
    assert (win.start_s, win.end_s, win.kind) == (1.0, 3.0, "waves")
    rules = ValidityRules(min_window_s=1.0, min_completions=8, completions_per_stream=2)
    a = assess(records, win, {"mode": "waves", "concurrency": 4}, rules, completions=8,
               arrived_tokens_per_s=None, completed_tokens_per_s=None)
    assert a.valid, a.reasons  # in flight falls to 1 at each wave's end: by design, not a client failure
    assert a.in_flight_target is None and a.completions_needed == 8


def test_bench_waves_against_continuous_batching_at_equal_b(sim_url, tmp_path) -> None:  # noqa: F811
    """One simulated SGLang server measured both ways at B = 8 with outputs of 8..96 tokens: a wave waits for
    its longest request, continuous batching refills each slot at once, so it serves more per second."""
    workload = tmp_path / "w.json"
    workload.write_bytes(orjson.dumps({"name": "waves", "seed": 5, "input": {"kind": "uniform", "min": 100, "max": 300},
                                       "output": {"kind": "uniform", "min": 8, "max": 96}}))
    (tmp_path / "trials").mkdir()
    runner = CliRunner()
    common = ["bench", "--url", sim_url, "--concurrency", "8", "--requests", "48", "--warmup", "8",
              "--workload", str(workload), "--min-window-s", "0.5", "--min-completions", "16",
             "--gpu-interval-ms", "200"]
    for name, extra in (("waves", ["--waves", "8"]), ("continuous", [])):
        out = runner.invoke(app, [*common, *extra, "--out", str(tmp_path / "trials" / f"{name}.json")])
        assert out.exit_code == 0, out.output
    w = orjson.loads((tmp_path / "trials" / "waves.json").read_bytes())
    assert w["load"]["mode"] == "waves" and w["summary"]["valid"] is True and w["summary"]["scenario"] == "waves"
    assert w["summary"]["completions_in_window"] == 48  # every measured wave, whole
    bad = runner.invoke(app, [*common, "--waves", "8", "--rate", "5", "--out", str(tmp_path / "x.json")])
    assert bad.exit_code == 2 and "--waves" in bad.output
    (f,) = [f for f in diagnose_dir(tmp_path) if f.kind == "batching.waves_vs_continuous"]
    ev = f.evidence
    assert ev["batch"] == 8 and ev["continuous_over_waves"] > 1.1, ev
    assert ev["waves_rps"] < ev["continuous_rps"] and f.severity == "info"


def test_virtual_time_runs_waves_as_waves() -> None:
    """The simulator in virtual time honours ``waves`` too: wave k+1 leaves once wave k has ended, and the
    same requests served continuously at the same B finish sooner."""
    from servetune.loadgen.config import LoadConfig
    from servetune.sim.virtual import simulate
    from servetune.workload import build_requests
    from servetune.workload.spec import Uniform, WorkloadSpec

    reqs = build_requests(WorkloadSpec(input=Uniform(min=100, max=300), output=Uniform(min=8, max=96), seed=5),
                          56).requests
    args = {"model_profile": "llama-3.1-8b", "gpu_profile": "A100-80G"}
    w = simulate(args, reqs, LoadConfig(mode="waves", concurrency=8, warmup_requests=8))
    c = simulate(args, reqs, LoadConfig(mode="concurrency", concurrency=8, warmup_requests=8))
    assert w.summary.scenario == "waves" and c.summary.scenario == "closed_loop"
    for k in range(1, 7):
        wave, prev = w.records[8 * k:8 * k + 8], w.records[8 * (k - 1):8 * k]
        assert min(r.t_send_s for r in wave) >= max(r.t_send_s + r.e2e_ms / 1000 for r in prev) - 1e-9
    assert c.summary.request_throughput > 1.2 * w.summary.request_throughput
