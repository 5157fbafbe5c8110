"""Helpers for tests/test_runners*.py: launch the misbehaving fake engine, check nothing is left."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil

from servetune.engines import SGLangConfig

FAKE_ENGINES = Path(__file__).parent


def fake_sglang(mode: str, model: str = "/models/fake", *, ready_timeout_s: float = 30.0, **env: str) -> SGLangConfig:
    """The SGLang engine config, launched against tests/fake_engines/sglang in ``mode``."""
    return SGLangConfig(model=model, python=sys.executable, ready_timeout_s=ready_timeout_s,
                        env={"PYTHONPATH": str(FAKE_ENGINES), "FAKE_ENGINE_MODE": mode, **env})


def alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_all_gone(pids, timeout_s: float = 15.0) -> list[int]:
    """Poll until none of ``pids`` is alive (bounded); the survivors, if any."""
    deadline = time.monotonic() + timeout_s
    left = alive(pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = alive(pids)
    return left


def worker_pids(log_lines) -> list[int]:
    for line in log_lines:
        if line.startswith("workers: "):
            return [int(x) for x in line.split()[1:]]
    return []


def tree(pid: int) -> list[int]:
    try:
        p = psutil.Process(pid)
        return [pid] + [c.pid for c in p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
