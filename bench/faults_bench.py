"""bench/faults.py's faults around one trial (``servetune bench``, ``sim serve``): the engine killed or frozen
under the load, HTTP errors and cut streams from tests/sse_server.py's fault server, a port taken, a disk
that fills while the result is written. Each returns (what the user saw, exit code); the checks go to ctx."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import time
from collections import Counter
from typing import Any

import orjson

from faults_kit import WORKLOAD, Ctx, served, sim, sse, wait_until

VALIDITY = ("--min-window-s", "0.5", "--min-completions", "4")


def _bench(ctx: Ctx, url: str, n: int, *extra: str, out: str = "r.json", tokens: int = 8) -> list[str]:
    wl = ctx.write("w.yaml", WORKLOAD % tokens)
    return ["bench", "--url", url, "--concurrency", "4", "--requests", str(n), "--warmup", "2", "--workload", wl,
            "--out", out, *VALIDITY, *extra]


def _result(ctx: Ctx, rel: str = "r.json") -> dict[str, Any]:
    path = ctx.tmp / rel
    if not ctx.check(path.is_file(), f"no result at {rel}"):
        return {"records": [], "summary": {}, "status": None, "failure_reason": None}
    return orjson.loads(path.read_bytes())


def _each_once(ctx: Ctx, d: dict[str, Any], sent: int) -> None:
    ids = [r["request_id"] for r in d["records"]]
    ctx.check(len(ids) == len(set(ids)), "a request is recorded twice")
    ctx.check(len(ids) == sent, f"{len(ids)} records for {sent} requests sent")


def _true_to_records(ctx: Ctx, d: dict[str, Any], line: str) -> Counter[str]:
    """The line may not contradict the result it sits above; the failed records' classes."""
    ok = sum(r["error_class"] is None for r in d["records"])
    classes = Counter(r["error_class"] for r in d["records"] if r["error_class"])
    ctx.check("no request was sent" not in line, f"the line says 'no request was sent', yet {ok} requests finished"
              f" and {sum(classes.values())} failed ({', '.join(f'{k}={v}' for k, v in classes.items())})")
    return classes


def engine_killed_mid_bench(ctx: Ctx) -> tuple[str, int]:
    with sim(ctx) as (url, proc):
        base = served(url)
        run = ctx.start(*_bench(ctx, url, 400, "--endpoint", "generate", tokens=64))
        wait_until(lambda: served(url) - base >= 8, 60, "8 requests served")
        os.killpg(proc.pid, signal.SIGKILL)  # the engine's whole process group
        out = run.finish(90)
    d = _result(ctx)
    line = ctx.line(out, r"^trial failed:", "stopped answering")
    ctx.check(out.code == 1, f"exit {out.code}, expected 1")
    ctx.check(d["status"] == "failed", f"status {d['status']}, expected failed")
    _each_once(ctx, d, 402)
    classes = _true_to_records(ctx, d, line)
    ctx.check(set(classes) <= {"connection"}, f"error classes {dict(classes)}")
    return line, out.code


def engine_frozen_mid_bench(ctx: Ctx) -> tuple[str, int]:
    with sim(ctx) as (url, proc):
        base = served(url)
        run = ctx.start(*_bench(ctx, url, 14, "--endpoint", "generate", "--idle-timeout", "2", tokens=64))
        wait_until(lambda: served(url) - base >= 6, 60, "6 requests served")
        os.killpg(proc.pid, signal.SIGSTOP)  # frozen: the kernel still accepts connections
        out = run.finish(90)
    d = _result(ctx)
    line = ctx.line(out, r"^trial failed:", "stopped answering")
    ctx.check(out.code == 1 and d["status"] == "failed", f"exit {out.code}, status {d['status']}")
    classes = _true_to_records(ctx, d, line)
    idle = [r for r in d["records"] if r["error_class"] == "idle_timeout"]
    ctx.check(idle, "no request failed as idle_timeout")
    ctx.check(all(2000 <= r["e2e_ms"] <= 2400 for r in idle),
              f"idle timeouts outside 2-2.4 s: {sorted(round(r['e2e_ms']) for r in idle)}")
    ctx.check(set(classes) == {"idle_timeout"}, f"failures: {dict(classes)}")
    _each_once(ctx, d, 16)
    ctx.check(out.seconds < 45, f"took {out.seconds:.0f} s")
    return line, out.code


def http_500_every_third(ctx: Ctx) -> tuple[str, int]:
    with sse(ttft_ms=5, gap_ms=5, fail_nth={i: "500" for i in range(2, 300, 3)}) as srv:
        out = ctx.servetune(*_bench(ctx, srv.url, 30, "--no-prime", tokens=32))
        posts = srv.posts
    d = _result(ctx)
    line = ctx.line(out, r"^\W*errors\s", "http_5xx=10")
    _each_once(ctx, d, posts)
    got = [r["error_message"] for r in d["records"] if r["error_class"] == "http_5xx" and not r["warmup"]]
    measured_500 = sum(1 for i in range(2, posts) if i % 3 == 2)  # the two warm-up requests are 0 and 1
    ctx.check(d["summary"].get("errors_by_class") == {"http_5xx": measured_500},
              f"errors_by_class {d['summary'].get('errors_by_class')}, sent {measured_500} 500s")
    ctx.check(len(got) == measured_500 and all("HTTP 500" in m for m in got), f"{len(got)} records classed "
              f"http_5xx (HTTP 500) of {measured_500}")
    ctx.check(out.code == 0 and d["status"] == "ok", f"exit {out.code}, status {d['status']}: the server's errors "
              "are a measurement, not a failed run")
    return line, out.code


def every_request_503(ctx: Ctx) -> tuple[str, int]:
    with sse(ttft_ms=5, gap_ms=5, fail_nth={i: "503" for i in range(300)}) as srv:
        out = ctx.servetune(*_bench(ctx, srv.url, 12, "--no-prime"))
    d = _result(ctx)
    line = ctx.line(out, r"^trial failed:", "every measured request failed", "rejected_503")
    ctx.check(out.code == 1, f"exit {out.code}, expected 1")
    ctx.check(d["status"] == "failed", f"status {d['status']}")
    _each_once(ctx, d, 14)
    return line, out.code


def stream_cut_mid_way(ctx: Ctx) -> tuple[str, int]:
    with sse(ttft_ms=5, gap_ms=5, fail_after_chunks=2, fail_nth={i: "reset" for i in range(3, 300, 4)}) as srv:
        out = ctx.servetune(*_bench(ctx, srv.url, 30, "--no-prime", "--idle-timeout", "5", tokens=32))
        posts = srv.posts
    d = _result(ctx)
    cut = [r for r in d["records"] if r["error_class"]]
    line = ctx.line(out, r"^\W*errors\s", "connection=")
    ctx.check(len(cut) == len(range(3, posts, 4)), f"{len(cut)} failed records, {len(range(3, posts, 4))} cut")
    ctx.check({r["error_class"] for r in cut} == {"connection"}, f"classes {Counter(r['error_class'] for r in cut)}")
    ctx.check(all(len(r["chunk_offsets_ms"] or []) == 2 for r in cut), "the chunks before the cut were not kept")
    _each_once(ctx, d, posts)
    return line, out.code


#: what the bench client may hold beyond its resting size while two streams never end (2 x the response bound
#: of servetune.loadgen.bounded, 128 MiB, and room for the interpreter)
ENDLESS_RSS_BOUND_MIB = 2 * 128 + 160


def _bench_rss(ctx: Ctx, argv: list[str]) -> tuple[Any, float]:
    """Run ``servetune ARGV``, its RSS sampled every 50 ms: (the outcome, MiB it grew from its least to its peak)."""
    import psutil

    run = ctx.start(*argv)
    proc, peak, rest = psutil.Process(run.pid), 0, None
    while run.proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            rss = proc.memory_info().rss
            rest = rss if rest is None else min(rest, rss)
            peak = max(peak, rss)
        time.sleep(0.05)
    return run.finish(10), (peak - (rest or 0)) / 2**20


def endless_line(ctx: Ctx) -> tuple[str, int]:
    """Two of 12 streams are one `data:` line that never ends (1 MiB a write): each fails at the response bound
    (response_too_large) well inside --timeout-s 30, the client's RSS sampled every 50 ms stays bounded."""
    with sse(ttft_ms=5, gap_ms=5, fail_nth={3: "endless", 8: "endless"}) as srv:
        out, grew = _bench_rss(ctx, _bench(ctx, srv.url, 12, "--no-prime", "--timeout-s", "30"))
        written = srv.endless_bytes
    d = _result(ctx)
    cut = [r for r in d["records"] if r["error_class"]]
    line = ctx.line(out, r"^\W*errors\s", "response_too_large=2")
    ctx.check([r["error_class"] for r in cut] == ["response_too_large"] * 2,
              f"failed: {[r['error_class'] for r in cut]}")
    ctx.check(all("passed 128 MiB" in (r["error_message"] or "") for r in cut), "the message does not name the bound")
    ctx.check(grew < ENDLESS_RSS_BOUND_MIB, f"the client grew {grew:.0f} MiB (bound {ENDLESS_RSS_BOUND_MIB} MiB)")
    ctx.check(out.seconds < 30, f"took {out.seconds:.0f} s: the timeout, not the bound, ended it")
    _each_once(ctx, d, 14)
    return f"{line} (client +{grew:.0f} MiB peak while the engine wrote {written / 2**20:.0f} MiB)", out.code


#: issue 44's own variants of an engine that sends without end, each in one stream: (fault, the request's class,
#: words its message holds)
UNBOUNDED = {"endless_event": ("response_too_large", "passed 128 MiB"),  # short lines, the event never closes
             "deep_json": ("response_too_large", "passed 128 MiB"),  # one event opening JSON arrays without end
             "endless_error": ("http_5xx", "HTTP 500"),  # an error status whose body never ends: 2 KiB kept
             "endless_headers": ("connection", "no end of headers"),  # a 200 whose headers never end
             "endless": ("response_too_large", "passed 128 MiB")}


def unbounded_answers(ctx: Ctx) -> tuple[str, int]:
    """Five of 16 streams each misbehave one way without end (UNBOUNDED): each fails with its own class at its
    bound, well inside --timeout-s 30; the other streams finish; the client's RSS stays bounded."""
    kinds = list(UNBOUNDED)
    with sse(ttft_ms=5, gap_ms=5, fail_nth={3 + 3 * i: k for i, k in enumerate(kinds)}) as srv:
        out, grew = _bench_rss(ctx, _bench(ctx, srv.url, 16, "--no-prime", "--timeout-s", "30"))
        written = srv.endless_bytes
    d = _result(ctx)
    cut = [r for r in d["records"] if r["error_class"]]
    got = [(r["error_class"], r["error_message"] or "") for r in sorted(cut, key=lambda r: r["request_id"])]
    ctx.check(len(got) == len(kinds), f"{len(got)} requests failed, {len(kinds)} were sent without end")
    for kind, (cls, msg) in zip(kinds, got, strict=False):
        want, words = UNBOUNDED[kind]
        ctx.check(cls == want and words in msg, f"{kind}: {cls} {msg[:80]!r}, expected {want} naming {words!r}")
    bound = 3 * 128 + 160  # three responses cut at 128 MiB may be in flight at once (4 streams)
    ctx.check(grew < bound, f"the client grew {grew:.0f} MiB (bound {bound} MiB)")
    ctx.check(out.seconds < 30, f"took {out.seconds:.0f} s: the timeout, not the bounds, ended it")
    _each_once(ctx, d, 18)
    line = ctx.line(out, r"^\W*errors\s", "response_too_large=3")
    return f"{line} (client +{grew:.0f} MiB peak while the engine wrote {written / 2**20:.0f} MiB)", out.code


def _held_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def port_in_use_sim(ctx: Ctx) -> tuple[str, int]:
    with _held_port() as s:
        port = s.getsockname()[1]
        out = ctx.servetune("sim", "serve", "--port", str(port), "--load-seconds", "0.2", timeout=60)
    line = ctx.line(out, r"^error:", str(port), "in use")
    ctx.check(out.code != 0, "exit 0")
    return line, out.code


def port_in_use_serve(ctx: Ctx) -> tuple[str, int]:
    with _held_port() as s:
        port = s.getsockname()[1]
        out = ctx.servetune("serve", "--engine", "sim", "--model", "llama-3.1-8b", "--port", str(port), "--log-dir",
                            str(ctx.tmp / "logs"), timeout=60)
    line = ctx.line(out, r"^dirty_environment:|^error:", str(port), "already in use")
    ctx.check(out.code == 1, f"exit {out.code}, expected 1")
    return line, out.code


@contextlib.contextmanager
def _small_disk(ctx: Ctx, kib: int, mode: str = "rw") -> Any:
    """A folder on a tmpfs of ``kib`` KiB, ``mode`` rw or ro (as root); else None."""
    where = ctx.tmp / "small"
    where.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", f"{mode},size={kib}k", "tmpfs",
                                                    str(where)], capture_output=True, check=False).returncode == 0
    try:
        yield where if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def disk_full_at_write(ctx: Ctx) -> tuple[str, int]:
    with sse(ttft_ms=5, gap_ms=5) as srv, _small_disk(ctx, 16) as small:
        out_rel = "small/r.json" if small else "r.json"
        argv = _bench(ctx, srv.url, 60, "--no-prime", out=out_rel)
        if small is None:  # no mount: a 16 KiB file-size limit on the command (EFBIG instead of ENOSPC)
            lim = (16 << 10, 16 << 10)
            run = ctx.start(*argv)
            resource.prlimit(run.pid, resource.RLIMIT_FSIZE, lim)
            out = run.finish(120)
        else:
            out = ctx.servetune(*argv)
        left = sorted(p.name for p in (ctx.tmp / "small").iterdir()) if small else []
        kept = (ctx.tmp / out_rel).is_file()
    line = ctx.line(out, r"^error:", out_rel)
    ctx.check(out.code != 0, "exit 0 with no result written")
    ctx.check(kept or "saved" in line or "kept" in line, f"the measured result (62 requests) is lost: nothing at "
              f"{out_rel} and the line names no other place")
    ctx.check(left in ([], ["r.json"]), f"a partial file is left behind: {left}")
    return line, out.code


def out_read_only(ctx: Ctx) -> tuple[str, int]:
    with sse(ttft_ms=5, gap_ms=5) as srv, _small_disk(ctx, 16, "ro") as ro:
        folder = str(ro) if ro else "/sys/fs"  # no mount: sysfs, which refuses new files even to root
        out = ctx.servetune(*_bench(ctx, srv.url, 10, "--no-prime", out=f"{folder}/r.json"))
        posts = srv.posts
    line = ctx.line(out, r"^error:", "--out", folder, "not writable")
    ctx.check(out.code == 2 and len(out.lines()) == 1, f"exit {out.code}, {len(out.lines())} lines")
    ctx.check(posts == 0, f"{posts} requests were sent before the refusal")
    return line, out.code
