"""Client-side faults against real servers: a stream that stalls mid-way (tests/sse_server.py, in
process), ``servetune bench`` interrupted by SIGINT/SIGTERM (a real process against ``servetune sim
serve``), and output paths that cannot be written (refused before any request)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from servetune.cli import app
from servetune.loadgen import LoadConfig, Target, run_load
from servetune.result import TrialResult
from servetune.workload.request import WorkloadRequest
from sim_process import sim_server
from sse_server import Scenario, SseServer
from test_trial import _serve

TINY = "name: tiny\nseed: 3\ninput: {kind: fixed, value: 32}\noutput: {kind: fixed, value: 8}\n"
IDLE_S = 0.5
UNWRITABLE = Path("/sys/fs")  # sysfs refuses new files even to root, where mode bits do not


def _tiny(tmp_path: Path, text: str = TINY) -> str:
    p = tmp_path / "tiny.yaml"
    p.write_text(text)
    return str(p)


async def _bench(*args: str):
    return await asyncio.to_thread(CliRunner().invoke, app, ["bench", *args])


def _lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.strip()]


# --- the stream idle timeout -------------------------------------------------------------------

async def test_a_stream_that_stalls_fails_as_idle_timeout_within_the_bound_and_the_trial_is_kept(tmp_path):
    # by arrival: #3 goes silent after two chunks, #6 after its role chunk, #9 sends only comments
    scenario = Scenario(ttft_ms=5, gap_ms=5, fail_after_chunks=2,
                        fail_nth={3: "stall_mid", 6: "stall", 9: "keepalive"})
    async with SseServer(scenario) as srv:
        out = tmp_path / "idle.json"
        r = await _bench("--url", srv.url, "--concurrency", "4", "--requests", "16", "--warmup", "1",
                         "--workload", _tiny(tmp_path), "--out", str(out), "--idle-timeout", str(IDLE_S),
                         "--timeout-s", "2", "--min-window-s", "0.1", "--min-completions", "4")
    assert r.exit_code == 0, r.output
    d = orjson.loads(out.read_bytes())
    assert d["status"] == "ok" and len(d["records"]) == 17 and d["target"]["idle_timeout_s"] == IDLE_S
    by_class: dict[str | None, list[dict]] = {}
    for rec in d["records"]:
        by_class.setdefault(rec["error_class"], []).append(rec)
    assert {k: len(v) for k, v in by_class.items()} == {None: 14, "idle_timeout": 2, "timeout": 1}
    assert d["summary"]["errors_by_class"] == {"idle_timeout": 2, "timeout": 1}
    timeout_ms = 2000
    # how late this client's event loop woke (its timers too); the loop's clock (uvloop) is as stale
    lag_ms = d["load"]["client_lag_max_ms"] or 0.0
    for rec in by_class["idle_timeout"]:  # failed at the idle bound, well before the total timeout
        assert IDLE_S * 1000 <= rec["e2e_ms"] < timeout_ms, rec
        silent = re.search(r"sent no byte for (\d+\.\d) s \(idle_timeout_s=0\.5\)", rec["error_message"])
        assert silent and IDLE_S <= float(silent[1]) < timeout_ms / 1000, rec
    mid = next(rec for rec in by_class["idle_timeout"] if rec["chunk_offsets_ms"])
    assert len(mid["chunk_offsets_ms"]) == 2 and mid["ttft_ms"] is not None  # what came before the stall
    # bytes that carry no tokens (SSE comments) are still bytes: only the total timeout ends that one
    assert timeout_ms - lag_ms - 5 <= by_class["timeout"][0]["e2e_ms"] <= timeout_ms + lag_ms + 300, (
        by_class["timeout"][0], lag_ms)
    # nothing else held the bench: its slowest request ends at the total timeout, and the load with it
    ends_s = max(r["t_send_s"] + r["e2e_ms"] / 1000 for r in d["records"])
    assert d["load"]["drain_end_s"] <= ends_s + (lag_ms + 300) / 1000, (d["load"], ends_s)
    from servetune.result import TrialResult

    kept = TrialResult.read(out)  # the strict check `validate` and `load` use takes the new class
    assert sorted(str(r.error_class) for r in kept.records if r.error_class) == ["idle_timeout"] * 2 + ["timeout"]


async def test_idle_timeout_zero_is_off_and_a_negative_one_names_the_option(tmp_path):
    async with SseServer(Scenario(ttft_ms=5, gap_ms=5, fail_nth={1: "stall"})) as srv:
        out = tmp_path / "off.json"
        r = await _bench("--url", srv.url, "--concurrency", "2", "--requests", "3", "--warmup", "0",
                         "--workload", _tiny(tmp_path), "--out", str(out), "--idle-timeout", "0",
                         "--timeout-s", "1", "--min-window-s", "0.1", "--min-completions", "1")
        assert r.exit_code == 0, r.output
        d = orjson.loads(out.read_bytes())
        assert d["target"]["idle_timeout_s"] is None and d["summary"]["errors_by_class"] == {"timeout": 1}
        r = await _bench("--url", srv.url, "--concurrency", "2", "--requests", "3", "--out", str(out),
                         "--idle-timeout", "-1")
        assert r.exit_code == 2
        assert _lines(r.output) == ["error: --idle-timeout: Input should be greater than 0"]


async def test_a_stopped_open_loop_load_keeps_what_was_sent_and_leaves_no_task_behind():
    reqs = [WorkloadRequest(index=i, system=None, user=f"#{i}", input_tokens=2, output_tokens=40)
            for i in range(60)]
    stop = asyncio.Event()
    stopped_at: list[int] = []

    def stop_after_ten(done: int, errors: int, tokens: int) -> None:  # by completions, not by the clock
        if done >= 10 and not stop.is_set():
            stopped_at.append(time.perf_counter_ns())
            stop.set()

    async with SseServer(Scenario(ttft_ms=5, gap_ms=2)) as srv:
        t0 = time.perf_counter_ns()
        out = await run_load(Target(url=srv.url), reqs, LoadConfig(mode="rate", rate=40, arrival="constant",
                             concurrency=8), t0_ns=t0, stop=stop, progress=stop_after_ten)
        ended = time.perf_counter_ns()
        await asyncio.sleep(0)
        left = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__.startswith("open_loop")]
        assert left == []  # no request task outlives the stopped load
        received = len(srv.log)
    assert out.stopped and 10 <= len(out.records) == received < 60
    assert [r.request_id for r in out.records] == list(range(len(out.records)))
    cancelled = [r for r in out.records if r.error_class == "cancelled"]
    assert 1 <= len(cancelled) <= 8 and all(r.ok for r in out.records if r not in cancelled)
    # time in flight until the stop: each was still in flight when it came and ended before the load did
    stop_ms, end_ms = (stopped_at[0] - t0) / 1e6, (ended - t0) / 1e6
    assert all(0 < r.e2e_ms and stop_ms <= r.t_send_s * 1000 + r.e2e_ms + 1e-3 <= end_ms for r in cancelled)


# --- bench interrupted: a partial result -------------------------------------------------------

def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _requests_served(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(float(v) for v in re.findall(r"^sglang:num_requests_total\{[^}]*\} (\S+)$", text, re.M))


@pytest.fixture(scope="module")
def sim(tmp_path_factory) -> Iterator[str]:
    with sim_server(tmp_path_factory.mktemp("sim"), "--load-seconds", "0", "--enable-metrics",
                    ready_path="/metrics") as server:
        yield server.url


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_bench_writes_the_requests_finished_so_far_and_exits_130(sim, tmp_path, sig):
    out = tmp_path / "partial.json"
    wl = _tiny(tmp_path, TINY.replace("value: 8", "value: 64"))
    base = _requests_served(sim)
    proc = subprocess.Popen([sys.executable, "-m", "servetune", "bench", "--url", sim, "--concurrency", "4",
                             "--requests", "5000", "--warmup", "2", "--workload", wl, "--out", str(out),
                             "--endpoint", "generate"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while _requests_served(sim) - base < 16:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr[-3000:]
    d = orjson.loads(out.read_bytes())
    reason = d["failure_reason"]
    assert d["status"] == "failed", reason
    assert reason.startswith(f"interrupted by {sig.name}: a partial result"), reason
    records = d["records"]
    classes = {r["error_class"] for r in records}
    ok = [r for r in records if r["error_class"] is None]
    assert classes <= {None, "cancelled"} and len(ok) >= 6 and len(records) - len(ok) <= 4
    assert f"{len(ok)} of 5002 requests finished ({len(records) - len(ok)} in flight were cancelled, " \
           f"{5002 - len(records)} never sent)" in reason
    assert all(r["e2e_ms"] > 0 and r["ttft_ms"] is not None for r in ok)
    assert d["summary"]["requests_ok"] == len([r for r in ok if not r["warmup"]])
    assert "result written to" in stderr and reason in stderr and "Traceback" not in stderr
    assert not list(tmp_path.glob("*.tmp"))


def test_an_engine_killed_mid_bench_is_one_line_with_what_was_sent_and_every_record_is_kept(tmp_path):
    """The engine's process dies during the load: the trial fails, its line says how many requests finished and
    failed (it used to reuse the preflight's 'no request was sent'), and the result keeps every record."""
    port = _port()
    engine = subprocess.Popen([sys.executable, "-m", "servetune", "sim", "serve", "--port", str(port),
                               "--load-seconds", "0", "--enable-metrics"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    url, out = f"http://127.0.0.1:{port}", tmp_path / "r.json"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                base = _requests_served(url)
                break
            except OSError:
                assert engine.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        proc = subprocess.Popen([sys.executable, "-m", "servetune", "bench", "--url", url, "--concurrency", "4",
                                 "--requests", "400", "--warmup", "2", "--workload",
                                 _tiny(tmp_path, TINY.replace("value: 8", "value: 64")), "--out", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while _requests_served(url) - base < 8:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        os.killpg(engine.pid, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if engine.poll() is None:
            os.killpg(engine.pid, signal.SIGKILL)
        engine.wait()
    d = orjson.loads(out.read_bytes())
    s = d["summary"]
    assert proc.returncode == 1 and d["status"] == "failed" and "Traceback" not in stderr
    assert len(d["records"]) == 402 and s["requests_ok"] >= 4 and s["requests_failed"] > 0
    assert d["failure_reason"] == (
        f"the target {url} stopped answering during the trial ({d['failure_reason'].split('(', 1)[1].split(')')[0]}"
        f")): {s['requests_ok']} of 400 measured requests finished, {s['requests_failed']} failed"
        f" ({', '.join(f'{k}: {v}' for k, v in sorted(s['errors_by_class'].items()))}); every request is in the result")
    assert "no request was sent" not in stderr and f"trial failed: {d['failure_reason']}" in stderr


def test_a_result_that_cannot_be_written_at_the_end_is_kept_in_the_temp_folder(tmp_path):
    """The --out folder passed the check, then became unwritable during the trial (as a disk fills; here a file
    took its place): the result is saved in the temp folder and the one line says where; no .tmp is left."""
    from servetune.commands.outpath import write_result
    from warehouse_fixtures import make_trial

    trial = make_trial(trial_id="rescued-1", n=4, warmup=0)
    (tmp_path / "was-a-folder").write_text("x")
    out = tmp_path / "was-a-folder" / "r.json"
    path, line = write_result(trial, out)
    assert path.name == "servetune-result-rescued-1.json" and path.is_file()
    assert line is not None and line.startswith(f"--out {out}: cannot write the result (")
    assert line.endswith(f"); it was saved to {path} instead")
    assert TrialResult.read(path).trial_id == "rescued-1"
    path.unlink()
    assert write_result(trial, tmp_path / "r.json") == (tmp_path / "r.json", None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "was-a-folder"]


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_a_taken_port_stops_the_simulated_server_in_one_line_before_it_says_ready(host: str) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as taken:
        try:
            taken.bind((host, 0))
        except OSError:
            pytest.skip(f"no {host} on this machine")
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run([sys.executable, "-m", "servetune", "sim", "serve", "--host", host, "--port", str(port),
                              "--load-seconds", "0"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr and "ready to roll" not in run.stderr, run.stderr
    assert [ln for ln in run.stderr.splitlines() if ln.startswith("error:")] == [
        f"error: --port {port}: cannot listen on {host}:{port}: address already in use"]


# --- output paths, checked before any request --------------------------------------------------

@pytest.fixture
async def watched():
    srv, seen = await _serve(Scenario(ttft_ms=5, gap_ms=2))
    yield srv, seen
    await srv.stop()


def _bench_out_cases(tmp_path: Path) -> list[tuple[Path, str]]:
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "a-file").write_text("x")
    cases = [
        (tmp_path / "a-folder", f"--out: {tmp_path / 'a-folder'} is a folder; give a file path"),
        (tmp_path / "missing" / "r.json", f"--out: folder {tmp_path / 'missing'} does not exist"),
        (tmp_path / "a-file" / "r.json", f"--out: {tmp_path / 'a-file'} is not a folder"),
    ]
    (tmp_path / "loop").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop")
    loop = f"--out: {tmp_path / 'loop'} is a symlink loop (Too many levels of symbolic links)"
    cases += [(tmp_path / "loop", loop), (tmp_path / "loop" / "r.json", loop)]
    if UNWRITABLE.is_dir():
        cases.append((UNWRITABLE / "r.json", f"--out: folder {UNWRITABLE} is not writable"))
    return cases


async def test_bench_refuses_an_out_path_it_cannot_write_before_any_request(watched, tmp_path):
    srv, seen = watched
    for out, expect in _bench_out_cases(tmp_path):
        r = await _bench("--url", srv.url, "--concurrency", "2", "--requests", "4", "--out", str(out))
        assert r.exit_code == 2, r.output
        assert len(_lines(r.output)) == 1 and _lines(r.output)[0].startswith(f"error: {expect}"), r.output
    assert seen.calls == []  # not even the reachability check


async def test_bench_writes_through_a_symlink_at_out_and_leaves_the_link(watched, tmp_path):
    srv, _ = watched
    (tmp_path / "kept").mkdir()
    links = {"to-file": tmp_path / "kept" / "old.json", "dangling": tmp_path / "kept" / "new.json"}
    links["to-file"].write_text("{}")
    for name, target in links.items():
        (tmp_path / name).symlink_to(target)
        r = await _bench("--url", srv.url, "--concurrency", "2", "--requests", "4", "--workload", _tiny(tmp_path),
                         "--min-window-s", "0.01", "--min-completions", "1", "--out", str(tmp_path / name))
        assert r.exit_code == 0, r.output
        assert (tmp_path / name).is_symlink() and orjson.loads(target.read_bytes())["status"] == "ok"


def test_report_refuses_an_out_folder_it_cannot_write_before_reading_anything(tmp_path):
    from report_fixtures import write_campaign

    (tmp_path / "a-file").write_text("x")
    cases = [
        (tmp_path / "a-file", f"--out: {tmp_path / 'a-file'} exists and is not a folder"),
        (tmp_path / "missing" / "report", f"--out: folder {tmp_path / 'missing'} does not exist"),
    ]
    if UNWRITABLE.is_dir():
        cases += [(UNWRITABLE / "report", f"--out: folder {UNWRITABLE} is not writable"),
                  (UNWRITABLE, f"--out: folder {UNWRITABLE} is not writable")]
    runner = CliRunner()
    for out, expect in cases:  # an experiment id with a warehouse that is not there: never asked
        res = runner.invoke(app, ["report", "exp-1", "--out", str(out), "--database-url",
                                  "postgresql://u:pw@127.0.0.1:1/nowhere"])
        lines = _lines(res.output)
        assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"report: {expect}"), res.output

    campaign = write_campaign(tmp_path / "runs")
    (campaign / "report").write_text("not a folder")  # where the default report would go
    res = runner.invoke(app, ["report", str(campaign)])
    assert res.exit_code == 2
    assert _lines(res.output) == [f"report: report folder: {campaign / 'report'} exists and is not a folder"]
    assert not list(campaign.glob("*.png"))


_DIES_ON_FLUSH = """
import os, sys
from aiohttp import web
async def ok(request): return web.json_response({})
async def flush(request): os._exit(3)
app = web.Application()
app.router.add_get("/health", ok); app.router.add_get("/get_server_info", ok)
app.router.add_post("/flush_cache", flush)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


def test_an_engine_that_dies_on_the_cache_flush_gets_one_line_naming_the_flush(tmp_path):
    """A real server process that exits when asked to flush its prefix cache: bench says in one line that it
    went away during the flush and that no request was sent (exit 2, no traceback)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", _DIES_ON_FLUSH, str(port)])
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        run = subprocess.run([sys.executable, "-m", "servetune", "bench", "--url", f"http://127.0.0.1:{port}",
                              "--concurrency", "2", "--requests", "4", "--workload", _tiny(tmp_path),
                              "--out", str(tmp_path / "r.json")], capture_output=True, text=True, timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    (error,) = [ln for ln in run.stderr.splitlines() if ln.startswith("error:")]
    assert "went away during the prefix-cache flush" in error and "no request was sent" in error


async def test_a_line_that_never_ends_fails_its_request_at_the_bound_and_the_memory_stays_bounded(monkeypatch):
    """An engine streaming one `data:` line without end (1 MiB a write): the request fails as
    response_too_large once the response passes the bound, long before its timeout, the other requests are
    unharmed, and the client holds no more than the bound per stream (its RSS sampled every 10 ms)."""
    import psutil

    from servetune import limits

    monkeypatch.setattr(limits, "MAX_RESPONSE_BYTES", 8 << 20)
    me = psutil.Process()
    peak = [me.memory_info().rss]
    base = peak[0]

    async def sample() -> None:
        while True:
            peak[0] = max(peak[0], me.memory_info().rss)
            await asyncio.sleep(0.01)

    reqs = [WorkloadRequest(index=i, system=None, user=f"hello #{i}", input_tokens=4, output_tokens=8)
            for i in range(6)]
    timeout_s = 30
    async with SseServer(Scenario(ttft_ms=5, gap_ms=5, fail_nth={1: "endless", 4: "endless"})) as srv:
        sampler = asyncio.create_task(sample())
        t = time.monotonic()
        out = await run_load(Target(url=srv.url, timeout_s=timeout_s), reqs, LoadConfig(concurrency=3),
                             t0_ns=time.perf_counter_ns())
        took = time.monotonic() - t
        sampler.cancel()
    failed = [r for r in out.records if r.error_class]
    assert [r.error_class for r in failed] == ["response_too_large"] * 2, [
        (r.error_class, r.error_message) for r in failed]
    assert all("passed 8 MiB" in r.error_message for r in failed)
    assert sum(r.error_class is None and r.output_tokens == 8 for r in out.records) == 4
    assert all(r.e2e_ms < timeout_s * 1000 for r in failed) and took < timeout_s, took  # at the bound, not at timeout_s
    assert peak[0] - base < 3 * 8 * (1 << 20) + (64 << 20), (peak[0] - base) / 2**20  # 2 cut streams + slack


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root (CI runs as root)")
def test_a_disk_that_fills_mid_campaign_says_where_and_how_to_resume_and_the_resume_finishes(tmp_path):
    """`tune --virtual` writing into a 192 KiB tmpfs: the disk fills after a few trials. One line names the path,
    the cause (ENOSPC) and the --resume command; experiment.json says interrupted, not running; once the disk is
    made bigger the same --resume finishes the campaign, every trial written before the fault kept."""
    small = tmp_path / "small"
    small.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=192k", "tmpfs", str(small)], capture_output=True)
    if mount.returncode != 0:
        pytest.skip(f"tmpfs mount refused: {mount.stderr.decode()[:200]}")
    plan = Path(__file__).resolve().parents[1] / "plans" / "demo.yaml"
    out = small / "c"
    cmd = [sys.executable, "-m", "servetune", "tune", str(plan), "--virtual", "--out", str(out)]
    env = {**os.environ, "COLUMNS": "300", "NO_COLOR": "1"}
    try:
        first = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        lines = [ln for ln in (first.stdout + first.stderr).splitlines() if ln.startswith("error:")]
        assert first.returncode == 2 and len(lines) == 1, first.stdout[-2000:] + first.stderr[-2000:]
        assert "No space left on device (ENOSPC)" in lines[0] and str(small) in lines[0], lines[0]
        assert f"--out {out} --resume" in lines[0] and "Traceback" not in first.stderr, lines[0]
        exp = orjson.loads((out / "experiment.json").read_bytes())
        assert exp["status"] == "interrupted" and "ENOSPC" in exp["status_reason"], exp["status"]
        kept = {p.name for p in (out / "trials").glob("*.json")}
        assert kept  # it filled mid-campaign, after trials were written
        subprocess.run(["mount", "-o", "remount,size=64m", str(small)], check=True)
        again = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=600, env=env)
        assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
        assert orjson.loads((out / "experiment.json").read_bytes())["status"] == "done"
        assert kept <= {p.name for p in (out / "trials").glob("*.json")}
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)


async def test_a_metrics_page_or_server_info_past_its_limit_is_refused_by_name_and_never_read_whole():
    """An engine whose /metrics, /server_info and /health answer without end (1 MiB a write): each read stops at
    its endpoint's limit (servetune.limits) with one message naming the endpoint and the limit."""
    from aiohttp import web

    from servetune.limits import MAX_METRICS_BYTES
    from servetune.telemetry.prometheus import MetricsScraper, MetricsUnavailable
    from servetune.telemetry.server_info import fetch_server_info

    written = [0]

    async def endless(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        try:
            while written[0] < 4 * MAX_METRICS_BYTES:  # a bound for the test itself
                await resp.write(b"#" * (1 << 20))
                written[0] += 1 << 20
        except (ConnectionError, RuntimeError):
            pass
        return resp

    app = web.Application()
    for path in ("/metrics", "/server_info", "/get_server_info", "/v1/models", "/version"):
        app.router.add_get(path, endless)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # noqa: SLF001
    try:
        with pytest.raises(MetricsUnavailable, match=r"GET .*/metrics: the response passed 16 MiB"):
            await MetricsScraper(url + "/metrics").snapshot()
        assert written[0] < 3 * MAX_METRICS_BYTES  # the client hung up at the limit
        info = await fetch_server_info(url)
        assert "the response passed 4 MiB" in str(info), info
    finally:
        await runner.cleanup()
