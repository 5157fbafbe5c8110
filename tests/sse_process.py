"""``tests/sse_server.py`` in its own process (uvloop), so a client under test never shares its event loop.

Split from sse_server.py (which re-exports ``ServerProcess``): this half only starts the script,
waits for its ready file and reads the send log it dumps on SIGTERM.
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson

SCRIPT = Path(__file__).with_name("sse_server.py")


class ServerProcess:
    """The server in its own process (uvloop), so a client under test never shares its event loop.

    ``log()`` after ``stop()`` returns the send log the process dumped on SIGTERM.
    """

    def __init__(
        self, scenario=None, workdir: Path | None = None, rt_priority: int = 0
    ) -> None:
        import tempfile

        if scenario is None:
            from sse_server import Scenario

            scenario = Scenario()
        self.scenario = scenario
        self.rt_priority = rt_priority
        self._dir = Path(workdir or tempfile.mkdtemp(prefix="sse-server-"))
        self._proc = None
        self.url = ""

    def start(self, timeout_s: float = 20.0) -> str:
        import subprocess
        import sys

        ready, logf = self._dir / "ready", self._dir / "sendlog.json"
        ready.unlink(missing_ok=True)
        sc = self.scenario
        argv = [
            sys.executable, str(SCRIPT), "--ready-file", str(ready), "--log-file", str(logf),
            "--ttft-ms", str(sc.ttft_ms), "--gap-ms", str(sc.gap_ms),
            "--tokens-per-chunk", str(sc.tokens_per_chunk), "--shape", sc.shape,
            "--rt-priority", str(self.rt_priority),
        ]  # fmt: skip
        self._proc = subprocess.Popen(argv)
        deadline = time.monotonic() + timeout_s
        while not (ready.exists() and ready.read_text()):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"sse_server did not start (exit code {self._proc.returncode})")
            time.sleep(0.02)
        self.url = ready.read_text()
        return self.url

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(15)
            except Exception:
                self._proc.kill()
                self._proc.wait(5)

    def log(self) -> dict[int, dict]:
        rows = orjson.loads((self._dir / "sendlog.json").read_bytes())
        return {int(k): v for k, v in rows.items()}

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
