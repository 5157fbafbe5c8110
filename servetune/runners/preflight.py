"""Clean-environment check before every trial: a number is only measured on a known, idle machine.

Dirty means: a foreign process on a target GPU, GPU memory in use beyond the idle threshold, or
the port already bound. Without NVML the GPU part says "no GPU" explicitly (never "clean") and the
port check still runs. ``REMOTE_PROBE`` is the same check as a stdlib-only snippet for an SSH host.
"""

from __future__ import annotations

import errno
import json
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from servetune.engines.failures import EngineFailure, FailureKind

MIB = 1024 * 1024


@dataclass
class PreflightReport:
    ok: bool
    problems: list[str] = field(default_factory=list)
    gpu: str = "not checked"
    port: str = "not checked"
    details: dict[str, Any] = field(default_factory=dict)

    def raise_if_dirty(self) -> None:
        if not self.ok:
            raise EngineFailure(FailureKind.dirty_environment, "; ".join(self.problems))


def port_free(host: str, port: int) -> bool:
    """Whether a server could bind ``host:port`` now (SO_REUSEADDR, as uvicorn binds)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def wait_port_free(host: str, port: int, timeout_s: float = 5.0) -> bool:
    """After teardown: the listening socket may take a moment to close with its last process."""
    deadline = time.monotonic() + timeout_s
    while not port_free(host, port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS considers free now (bound to 0, then released)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_holder(port: int) -> str:
    """Who listens on ``port`` (best effort: needs privileges to see other users' sockets)."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                return f" by pid {conn.pid} ({psutil.Process(conn.pid).name()})"
    except Exception:  # AccessDenied on macOS, a process gone meanwhile: the holder is a nicety
        pass
    return ""


def check_gpus(gpus: Sequence[int] | None, *, idle_mib: int,
               own_pids: Iterable[int] = ()) -> tuple[str, list[str], dict]:
    """``(summary, problems, details)`` for the target GPUs via NVML; "no GPU" where NVML is absent."""
    from servetune.telemetry.nvml import GpuUnavailable, gpu_memory_used, gpu_processes

    own = set(own_pids)
    try:
        procs = gpu_processes(gpus, own_pids=own)
        used = gpu_memory_used(gpus)
    except GpuUnavailable as exc:
        return f"no GPU ({exc})", [], {"gpu_available": False}
    problems = []
    foreign = [p for p in procs if p.get("foreign", True)]
    for p in foreign:
        mem = f", {p['used_memory'] / MIB:.0f} MiB" if p.get("used_memory") else ""
        problems.append(f"GPU {p['gpu']} is used by a foreign process: pid {p['pid']} ({p.get('name') or '?'}{mem})")
    if not own:
        for index, used_bytes in used.items():
            if used_bytes > idle_mib * MIB:
                problems.append(f"GPU {index} has {used_bytes / MIB:.0f} MiB in use (idle is <= {idle_mib} MiB)")
    summary = ", ".join(f"GPU {i}: {b / MIB:.0f} MiB used" for i, b in sorted(used.items()))
    return summary, problems, {"gpu_available": True, "processes": procs, "memory_used": used}


def check_clean(*, host: str, port: int | None, gpus: Sequence[int] | None, idle_mib: int = 2048,
                own_pids: Iterable[int] = ()) -> PreflightReport:
    """The local check. ``port=None`` skips the port (a server of ours already holds it)."""
    problems: list[str] = []
    port_text = "not checked"
    if port is not None:
        if port_free(host, port):
            port_text = f"{host}:{port} free"
        else:
            port_text = f"{host}:{port} in use{_port_holder(port)}"
            problems.append(f"port {port} on {host} is already in use{_port_holder(port)}")
    gpu_text, gpu_problems, details = check_gpus(gpus, idle_mib=idle_mib, own_pids=own_pids)
    problems += gpu_problems
    return PreflightReport(ok=not problems, problems=problems, gpu=gpu_text, port=port_text, details=details)


def wait_gpu_released(gpus: Sequence[int] | None, *, idle_mib: int, timeout_s: float) -> str:
    """After teardown: poll until the GPUs are back near idle; a one-line verdict."""
    from servetune.telemetry.nvml import GpuUnavailable, gpu_memory_used

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            used = gpu_memory_used(gpus)
        except GpuUnavailable as exc:
            return f"no GPU ({exc})"
        busy = {i: b for i, b in used.items() if b > idle_mib * MIB}
        if not busy:
            return "released"
        if time.monotonic() >= deadline:
            return "not released: " + ", ".join(f"GPU {i} {b / MIB:.0f} MiB" for i, b in sorted(busy.items()))
        time.sleep(0.5)


#: the same check for a remote host, run there with ``python3 -c`` (stdlib, plus pynvml when installed)
REMOTE_PROBE = r'''
import errno, json, socket, sys
port = int(sys.argv[1]) if sys.argv[1] != "-" else None
gpus = [int(g) for g in sys.argv[2].split(",")] if sys.argv[2] != "-" else None
out = {"port_free": None, "free_port": None, "gpu": None}
def _free(p):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", p))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True
if port is not None:
    out["port_free"] = _free(port)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    out["free_port"] = s.getsockname()[1]
try:
    import pynvml as nv
    nv.nvmlInit()
    idx = gpus if gpus is not None else list(range(nv.nvmlDeviceGetCount()))
    g = {"memory_used": {}, "processes": []}
    for i in idx:
        h = nv.nvmlDeviceGetHandleByIndex(i)
        g["memory_used"][str(i)] = nv.nvmlDeviceGetMemoryInfo(h).used
        for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
            g["processes"].append({"gpu": i, "pid": p.pid, "used_memory": getattr(p, "usedGpuMemory", None)})
    out["gpu"] = g
except Exception as e:
    out["gpu_error"] = type(e).__name__ + ": " + str(e)
print(json.dumps(out))
'''


def report_from_remote(data: dict[str, Any], *, host: str, port: int | None, idle_mib: int,
                       own_gpu_pids: Iterable[int] = ()) -> PreflightReport:
    """A ``PreflightReport`` from ``REMOTE_PROBE``'s JSON."""
    problems: list[str] = []
    port_text = "not checked"
    if port is not None:
        port_text = f"{host}:{port} {'free' if data.get('port_free') else 'in use'}"
        if not data.get("port_free"):
            problems.append(f"port {port} on {host} is already in use")
    gpu = data.get("gpu")
    if gpu is None:
        return PreflightReport(ok=not problems, problems=problems, port=port_text,
                               gpu=f"no GPU ({data.get('gpu_error', 'NVML unavailable')})", details=data)
    own = set(own_gpu_pids)
    for p in gpu["processes"]:
        if p["pid"] not in own:
            problems.append(f"GPU {p['gpu']} on {host} is used by a foreign process: pid {p['pid']}")
    if not own:
        for index, used in gpu["memory_used"].items():
            if used > idle_mib * MIB:
                problems.append(f"GPU {index} on {host} has {used / MIB:.0f} MiB in use (idle is <= {idle_mib} MiB)")
    summary = ", ".join(f"GPU {i}: {b / MIB:.0f} MiB used" for i, b in sorted(gpu["memory_used"].items()))
    return PreflightReport(ok=not problems, problems=problems, port=port_text, gpu=summary, details=data)


def remote_probe_json(stdout: str) -> dict[str, Any]:
    line = next((ln for ln in reversed(stdout.strip().splitlines()) if ln.startswith("{")), "{}")
    return json.loads(line)
