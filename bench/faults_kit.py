"""The harness of bench/faults.py's catalogue: run ``python -m servetune`` as a user does (in a temp dir, with a
tag in its environment that every process it starts inherits), real fixtures (the simulated SGLang server,
tests/sse_server.py's fault server, a private PostgreSQL), and the checks every fault gets: one line, no
traceback, no secret in any output or written file, no tagged process left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
if str(TESTS) not in sys.path:
    sys.path.append(str(TESTS))  # tests/sse_server.py, tests/warehouse_fixtures.py, tests/fake_engines

SECRET = "Fault-S3cret-tok-7741"  # the API key every command is given (SERVETUNE_API_KEY): never to be shown
TAG = "SERVETUNE_FAULTS_TAG"  # in every command's environment, so its processes (and theirs) can be found
TRACEBACK = "Traceback (most recent call last)"
#: not a message: log records and progress bars
NOISE = re.compile(r"^\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d|^bench\s.*\d+/\d+")
WORKLOAD = "name: faults\nseed: 3\ninput: {kind: fixed, value: 64}\noutput: {kind: fixed, value: %d}\n"


@dataclass
class Outcome:
    argv: list[str]
    code: int
    stdout: str
    stderr: str
    seconds: float

    def lines(self) -> list[str]:
        text = self.stderr + "\n" + self.stdout
        return [ln.strip() for ln in text.splitlines() if ln.strip() and not NOISE.match(ln.strip())]


class Running:
    """A ``servetune`` command in flight: its output goes to files (no pipe to fill), read at any time."""

    def __init__(self, ctx: Ctx, argv: list[str], env: dict[str, str]) -> None:
        self.argv, n = argv, len(ctx.outcomes) + len(ctx.running)
        self.out_path, self.err_path = ctx.tmp / f".cmd{n}.out", ctx.tmp / f".cmd{n}.err"
        ctx.ours |= {self.out_path, self.err_path}
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "servetune", *argv], cwd=ctx.tmp, env=env,
                                         stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        self.t0, self.ctx = time.monotonic(), ctx
        ctx.running.append(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def text(self) -> str:
        return self.err_path.read_text(errors="replace") + self.out_path.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        """Poll the output for ``pattern``; raise if the command ends or the time runs out first."""
        deadline = time.monotonic() + timeout
        while not (m := re.search(pattern, self.text(), re.MULTILINE)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise FaultSetupError(f"never saw {pattern!r} (exit {self.proc.poll()}): {self.text()[-600:]}")
            time.sleep(0.05)
        return m

    def finish(self, timeout: float) -> Outcome:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = 124
            self.ctx.check(False, f"still running after {timeout:g} s (killed)")
        self.ctx.running.remove(self)
        out = Outcome(self.argv, code, self.out_path.read_text(errors="replace"),
                      self.err_path.read_text(errors="replace"), time.monotonic() - self.t0)
        self.ctx.outcomes.append(out)
        return out


class FaultSetupError(RuntimeError):
    """The fault could not be provoked as designed (not a verdict on servetune's handling)."""


@dataclass
class Ctx:
    """One fault's world: its temp dir, its tag, every command it ran, and what was found wrong."""

    tmp: Path
    tag: str = field(default_factory=lambda: uuid.uuid4().hex)
    outcomes: list[Outcome] = field(default_factory=list)
    running: list[Running] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    ours: set[Path] = field(default_factory=set)  # files the harness wrote: not searched for the secret

    def env(self, **extra: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SERVETUNE_", "AIRFLOW_CONN_", "FORCE_COLOR"))}
        return {**base, "COLUMNS": "80", "NO_COLOR": "1", "SERVETUNE_API_KEY": SECRET, TAG: self.tag, **extra}

    def check(self, ok: Any, why: str) -> bool:
        if not ok:
            self.problems.append(why)
        return bool(ok)

    def write(self, rel: str, text: str) -> str:
        path = self.tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        self.ours.add(path)
        return str(path)

    def start(self, *argv: str, **env: str) -> Running:
        return Running(self, list(argv), self.env(**env))

    def servetune(self, *argv: str, timeout: float = 120, **env: str) -> Outcome:
        return self.start(*argv, **env).finish(timeout)

    def line(self, out: Outcome, pattern: str, *words: str) -> str:
        """The one line matching ``pattern`` (checked: exactly one, naming ``words``); else the first line."""
        found = [ln for ln in out.lines() if re.search(pattern, ln)]
        self.check(len(found) == 1, f"{len(found)} lines match {pattern!r}, expected 1")
        line = found[0] if found else (out.lines() or ["(nothing)"])[0]
        missing = [w for w in words if w.lower() not in line.lower()]
        self.check(not missing, f"the line does not name {', '.join(map(repr, missing))}")
        return line

    def finish_all(self) -> None:
        for run in list(self.running):
            with contextlib.suppress(ProcessLookupError):
                run.proc.kill()
            run.finish(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(cond: Callable[[], Any], timeout: float, what: str, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := cond()):
        if time.monotonic() > deadline:
            raise FaultSetupError(f"timed out waiting for {what}")
        time.sleep(every)
    return got


def tagged(tag: str) -> list[psutil.Process]:
    """Live processes whose environment carries ``tag`` (a command under test, or anything it started)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(TAG) == tag and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.Error, OSError):
            pass
    return found


def left_behind(tag: str, wait_s: float = 15.0) -> list[str]:
    """Tagged processes still alive after ``wait_s`` (then killed by pid, so the next fault starts clean)."""
    deadline = time.monotonic() + wait_s
    while (left := tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    named = []
    for p in left:
        with contextlib.suppress(psutil.Error):
            named.append(f"pid {p.pid} ({' '.join(p.cmdline())[:80]})")
            p.send_signal(signal.SIGCONT)
            p.kill()
    return named


def secret_shown(ctx: Ctx) -> list[str]:
    """Where SECRET appears: any command's output, any file the commands wrote under the temp dir."""
    where = [" ".join(o.argv[:2]) + " output" for o in ctx.outcomes if SECRET in o.stdout + o.stderr]
    for path in ctx.tmp.rglob("*"):
        if path.is_file() and not path.is_symlink() and path not in ctx.ours and path.stat().st_size < 64 << 20:
            with contextlib.suppress(OSError):
                if SECRET.encode() in path.read_bytes():
                    where.append(str(path.relative_to(ctx.tmp)))
    return where


# --- fixtures ----------------------------------------------------------------------------------------

def get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


def served(url: str) -> float:
    """Requests the simulated server has finished (its sglang:num_requests_total counter)."""
    code, text = get(url + "/metrics")
    if not code:
        return 0
    return sum(float(v) for v in re.findall(r"^sglang:num_requests_total\{[^}]*\} (\S+)$", text, re.MULTILINE))


@contextlib.contextmanager
def sim(ctx: Ctx) -> Iterator[tuple[str, subprocess.Popen]]:
    """``servetune sim serve`` in its own session (not tagged: the fixture, not the command under test)."""
    port, log = free_port(), ctx.tmp / ".sim-fixture.log"
    ctx.ours.add(log)
    env = {k: v for k, v in os.environ.items() if k != TAG}
    with log.open("wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "servetune", "sim", "serve", "--port", str(port),
                                 "--model-profile", "llama-3.1-8b", "--gpu-profile", "A100-80G", "--load-seconds",
                                 "0.2", "--enable-metrics", "--enable-cache-report"],
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: get(url + "/health_generate")[0] == 200 or proc.poll() is not None, 60, "the sim")
        if proc.poll() is not None:
            raise FaultSetupError(f"the sim fixture exited: {log.read_text()[-400:]}")
        yield url, proc
    finally:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        proc.wait()


@contextlib.contextmanager
def sse(**scenario: Any) -> Iterator[Any]:
    """tests/sse_server.py's SseServer (a real aiohttp server that fails on schedule) on a thread's loop."""
    from sse_server import Scenario, SseServer

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    srv = SseServer(Scenario(**scenario))
    try:
        asyncio.run_coroutine_threadsafe(srv.start(), loop).result(20)
        yield srv
    finally:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(srv.stop(), loop).result(20)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


class Warehouse:
    """One private PostgreSQL cluster for the whole catalogue (servetune.localdb), with the stop, start and
    freeze the faults need (as tests/test_reliability_warehouse.py does); a fresh database per fault."""

    _shared: Warehouse | None = None

    def __init__(self) -> None:
        from servetune import localdb

        self.pg = localdb.start_private_cluster()
        self.where = f"127.0.0.1:{self.pg.port}"

    @classmethod
    def get(cls) -> Warehouse:
        if cls._shared is None:
            cls._shared = Warehouse()
        return cls._shared

    @classmethod
    def close(cls) -> None:
        if cls._shared is not None:
            cls._shared.pg.stop()
            cls._shared = None

    @contextlib.contextmanager
    def database(self) -> Iterator[str]:
        """A fresh, migrated database; its URL carries SECRET as the password (trust auth ignores it)."""
        from sqlalchemy.engine import make_url

        from servetune import localdb
        from servetune.warehouse import migrate

        url = make_url(localdb.create_database(self.pg.url)).set(password=SECRET)
        url = url.render_as_string(hide_password=False)
        migrate.upgrade(url)
        try:
            yield url
        finally:
            with contextlib.suppress(Exception):
                localdb.drop_database(self.pg.url, make_url(url).database)

    @staticmethod
    def connect(url: str, **kw: Any) -> Any:
        import psycopg

        from servetune import localdb

        return psycopg.connect(localdb.libpq_dsn(url), **kw)

    def stored(self, url: str, exp_id: str) -> tuple[int, int, int]:
        """(trials, distinct trials, request rows) of one experiment: a duplicate or a loss shows."""
        with self.connect(url) as conn:
            n, distinct = conn.execute("SELECT count(*), count(DISTINCT trial_id) FROM trials WHERE experiment_id"
                                       " = %s", (exp_id,)).fetchone()
            rows = conn.execute("SELECT count(*) FROM request_records r JOIN trials t USING (trial_id) "
                                "WHERE t.experiment_id = %s", (exp_id,)).fetchone()[0]
        return n, distinct, rows


def campaign_folder(ctx: Ctx, exp_id: str) -> tuple[Path, int]:
    """A campaign folder of three trials (tests/warehouse_fixtures.py); (its path, its request records)."""
    from warehouse_fixtures import make_trial, write_campaign

    exp = {"experiment_id": exp_id, "model": "m", "engine": "sglang", "trigger": "manual", "status": "finished"}
    trials = [make_trial(trial_id=f"{exp_id}-c{c}", experiment_id=exp_id, concurrency=c, n=40, warmup=2, seed=c)
              for c in (4, 8, 16)]
    folder = write_campaign(ctx.tmp / exp_id, exp, trials)
    ctx.ours |= set(folder.rglob("*"))
    return folder, sum(len(t.records) for t in trials)
