"""The last line against orphans: every engine a campaign starts carries an owner tag in its
environment, so whatever survived (a worker killed with SIGKILL, a machine-level hiccup) can be found
and its process group killed by the orchestrator's teardown, long after the starting process is gone."""

from __future__ import annotations

import os
import signal

import psutil

OWNER_ENV = "SERVETUNE_OWNER"


def owned_processes(owner: str) -> list[psutil.Process]:
    """Live processes of this user whose environment names ``owner`` (engines and their workers)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != os.getpid() and proc.environ().get(OWNER_ENV) == owner:
                found.append(proc)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def sweep(owner: str, grace_s: float = 10.0) -> list[int]:
    """SIGTERM the process groups of every process tagged ``owner``, SIGKILL what is left; the PIDs found."""
    procs = owned_processes(owner)
    pids = [p.pid for p in procs]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            try:
                os.killpg(os.getpgid(p.pid), sig)
            except (ProcessLookupError, PermissionError):
                try:
                    p.send_signal(sig)
                except psutil.Error:
                    pass
        _, procs = psutil.wait_procs(procs, timeout=grace_s)
        if not procs:
            break
    return pids
