"""``tests/sse_server.py`` in its own process (uvloop), so a client under test never shares its event loop.

Split from sse_server.py (which re-exports ``ServerProcess``): this half only starts the script,
waits for its ready file and reads the send log it dumps on SIGTERM. ``processes`` > 1 starts that many
on one port (SO_REUSEPORT), for loads one process cannot keep on schedule; their send logs are merged.
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson

SCRIPT = Path(__file__).with_name("sse_server.py")


class ServerProcess:
    """The server in its own process (uvloop), so a client under test never shares its event loop.

    ``log()`` after ``stop()`` returns the send log the processes dumped on SIGTERM; ``chunks_sent()``
    reads their shared counter file at any time (no request to them).
    """

    def __init__(
        self, scenario=None, workdir: Path | None = None, rt_priority: int = 0, processes: int = 1
    ) -> None:
        import tempfile

        if scenario is None:
            from sse_server import Scenario

            scenario = Scenario()
        self.scenario = scenario
        self.rt_priority = rt_priority
        self.processes = processes
        self._dir = Path(workdir or tempfile.mkdtemp(prefix="sse-server-"))
        self._procs: list = []
        self._counts = None
        self.url = ""

    def start(self, timeout_s: float = 20.0) -> str:
        """The first process picks a free port; the others join it."""
        import numpy as np

        counter = self._dir / "chunks.i64"
        counter.write_bytes(bytes(8 * self.processes))
        self._counts = np.memmap(counter, dtype=np.int64, mode="r")
        port = 0
        for i in range(self.processes):
            self._spawn(i, port, counter, timeout_s)
            port = int(self.url.rsplit(":", 1)[1])
        return self.url

    def _spawn(self, i: int, port: int, counter: Path, timeout_s: float) -> None:
        import subprocess
        import sys

        ready, logf = self._dir / f"ready-{i}", self._dir / f"sendlog-{i}.json"
        ready.unlink(missing_ok=True)
        sc = self.scenario
        argv = [
            sys.executable, str(SCRIPT), "--ready-file", str(ready), "--log-file", str(logf),
            "--port", str(port), "--counter-file", str(counter), "--counter-slot", str(i),
            "--ttft-ms", str(sc.ttft_ms), "--gap-ms", str(sc.gap_ms),
            "--tokens-per-chunk", str(sc.tokens_per_chunk), "--shape", sc.shape,
            "--rt-priority", str(self.rt_priority),
        ] + (["--reuse-port"] if self.processes > 1 else [])  # fmt: skip
        proc = subprocess.Popen(argv)
        self._procs.append(proc)
        deadline = time.monotonic() + timeout_s
        while not (ready.exists() and ready.read_text()):
            if proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"sse_server did not start (exit code {proc.returncode})")
            time.sleep(0.02)
        self.url = ready.read_text()

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    def chunks_sent(self) -> int:
        """Content chunks written so far, all processes together."""
        return int(self._counts.sum()) if self._counts is not None else 0

    def stop(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(15)
            except Exception:
                proc.kill()
                proc.wait(5)

    def log(self) -> dict[int, dict]:
        merged: dict[int, dict] = {}
        for i in range(len(self._procs)):
            rows = orjson.loads((self._dir / f"sendlog-{i}.json").read_bytes())
            merged.update((int(k), v) for k, v in rows.items())
        return merged

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
