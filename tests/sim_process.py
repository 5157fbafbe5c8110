"""``servetune sim serve`` in its own process for the tests that drive it over HTTP: started on a free loopback
port, its output in a file (the simulator logs a line per prefill batch, and an unread pipe fills and freezes it),
ready when a path answers 200, stopped (SIGTERM, then SIGKILL) whatever happens."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from servetune.runners.preflight import free_port


@dataclass
class SimServer:
    url: str
    log_path: Path
    saw_503: bool = False  # the ready path answered 503 (loading) before it answered 200
    ready_s: float = 0.0  # from the spawn to the first 200


@contextlib.contextmanager
def sim_server(log_dir: Path, *args: str, ready_path: str = "/health", timeout_s: float = 60.0,
               poll_s: float = 0.1) -> Iterator[SimServer]:
    port = free_port("127.0.0.1")
    server = SimServer(url=f"http://127.0.0.1:{port}", log_path=log_dir / "sim.log")
    t0 = time.monotonic()
    with server.log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "servetune", "sim", "serve", "--port", str(port), *args],
                                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            while True:
                try:
                    with urllib.request.urlopen(server.url + ready_path, timeout=5) as resp:
                        if resp.status == 200:
                            break
                except urllib.error.HTTPError as exc:
                    server.saw_503 |= exc.code == 503
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() - t0 > timeout_s:
                    tail = server.log_path.read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"the simulated server did not become ready: {tail}")
                time.sleep(poll_s)
            server.ready_s = time.monotonic() - t0
            yield server
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
