"""Simulator figures: virtual-time speed-up and real-time emission accuracy.

1. Virtual time: ``simulate`` over 1,000 requests at concurrency 64 on the 8B / A100-80G profile
   (input 1-4k tokens, output 256-1024); speed-up = simulated duration / wall time, the summary
   (servetune.metrics.summarize) included, median of ``--repeats`` runs.
2. Real time: a ``python -m servetune sim serve`` process streamed by servetune's load generator
   at each ``--streams`` level; the server's own record of |write time - modelled time| per token
   (``/server_info`` internal_states[0].sim_emission_error_ms) and of the engine's wake-up.

    .venv/bin/python bench/sim_speed.py [--repeats 3] [--streams 64 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from servetune.loadgen import LoadConfig, Target, run_load
from servetune.sim import server_args_from_flags, simulate
from servetune.workload import build_requests
from servetune.workload.spec import Uniform, WorkloadSpec

REPO = Path(__file__).resolve().parents[1]


def virtual(repeats: int) -> None:
    spec = WorkloadSpec(input=Uniform(min=1000, max=4000), output=Uniform(min=256, max=1024), seed=1)
    reqs = build_requests(spec, 1064).requests
    args = server_args_from_flags({})
    load = LoadConfig(concurrency=64, warmup_requests=64)
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        res = simulate(args, reqs, load)
        wall = time.perf_counter() - t
        runs.append((res.environment["virtual_duration_s"], wall))
    vdur = runs[0][0]
    wall = statistics.median(w for _, w in runs)
    from servetune.metrics import summarize

    t = time.perf_counter()
    summarize(res.records, window=(res.summary.window_start_s, res.summary.window_end_s), sla=None, gpu=res.gpu,
              server=res.server, lengths_exact=True)
    summ = time.perf_counter() - t
    print(f"virtual: 1,064 requests (64 warm-up) at concurrency 64, 8B/A100-80G: simulated {vdur:.1f} s "
          f"in {wall:.2f} s wall (median of {repeats}: {', '.join(f'{w:.2f}' for _, w in runs)}) "
          f"-> speed-up {vdur / wall:.0f}x; of which servetune.metrics.summarize {summ:.2f} s "
          f"(speed-up without it {vdur / max(wall - summ, 1e-9):.0f}x)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def real_time(streams: int) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "servetune", "sim", "serve", "--port", str(port),
                             "--load-seconds", "0.2"], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ})
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(url + "/health_generate", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        spec = WorkloadSpec(input=Uniform(min=200, max=1000), output=Uniform(min=100, max=200), seed=2)
        reqs = build_requests(spec, 2 * streams).requests
        t = time.perf_counter()
        out = asyncio.run(run_load(Target(url=url, endpoint="chat"), reqs, LoadConfig(concurrency=streams),
                                   t0_ns=time.perf_counter_ns()))
        wall = time.perf_counter() - t
        st = _get(url + "/server_info")["internal_states"][0]
        e, w, slip = st["sim_emission_error_ms"], st["sim_wake_error_ms"], st["sim_slip_ms"]
        ok = sum(r.ok for r in out.records)
        print(f"real time: {streams} streams, {len(reqs)} requests ({ok} ok) in {wall:.1f} s: emission error "
              f"|write - modelled| over {e['count']} token writes p50 {e['p50']:.3f} ms, p99 {e['p99']:.3f} ms, "
              f"max {e['max']:.2f} ms; engine wake-up p50 {w['p50']:.3f} ms, p99 {w['p99']:.3f} ms; schedule slip "
              f"{slip.get('total', 0.0):.1f} ms in all over {slip['count']} late starts")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--streams", type=int, nargs="*", default=[64, 256])
    ns = ap.parse_args()
    with open("/proc/loadavg") as f:
        print(f"load average at start: {f.read().split()[:3]} on {os.cpu_count()} CPUs")
    virtual(ns.repeats)
    for n in ns.streams:
        real_time(n)


if __name__ == "__main__":
    main()
