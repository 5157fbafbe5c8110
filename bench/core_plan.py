"""Which CPUs bench/client_overhead.py gives its server processes and the client under test.

Left to the scheduler, the client may run on a core a busy server process also uses (or on its SMT
sibling), and what it then costs in CPU-seconds per chunk depends on the placement, not on the client.
So, where the machine has enough physical cores, each server process gets a core of its own, the client
(all its workers) the next ones, and the bench itself the cores left (none of their siblings); every client
at a level gets the same cores. On the lent 16-core host (no SMT) this did not narrow the CPU figure's
run-to-run spread (docs/benchmarks.md); it keeps one known cause of it out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psutil

SYS_CPU = Path("/sys/devices/system/cpu")


@dataclass(frozen=True)
class CorePlan:
    servers: list[int]  # one logical CPU per server process, each on its own physical core
    client: set[int]  # one logical CPU per physical core given to the client
    rest: set[int]  # the bench's own sampling: everything else

    def describe(self) -> str:
        return f"server CPUs {self.servers}, client CPUs {sorted(self.client)}"


def _cpu_list(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]"""
    cpus: list[int] = []
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def physical_cores(cpus: set[int]) -> list[list[int]]:
    """The allowed logical CPUs grouped by physical core (SMT siblings together), in CPU order."""
    cores: dict[tuple[int, ...], list[int]] = {}
    for cpu in sorted(cpus):
        try:
            siblings = tuple(_cpu_list((SYS_CPU / f"cpu{cpu}/topology/thread_siblings_list").read_text()))
        except (OSError, ValueError):
            siblings = (cpu,)
        cores.setdefault(siblings, []).append(cpu)
    return list(cores.values())


def allowed_cpus() -> set[int] | None:
    """The CPUs this process may use (take it before pinning anything); None where that cannot be known."""
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None


def plan(server_procs: int, client_cores: int, allowed: set[int] | None) -> CorePlan | None:
    """None where the cores are too few to keep server and client apart (then nothing is pinned)."""
    if not allowed:
        return None
    cores = physical_cores(allowed)
    if len(cores) < server_procs + client_cores:
        return None
    servers = [core[0] for core in cores[:server_procs]]
    client = {core[0] for core in cores[server_procs:server_procs + client_cores]}
    rest = {cpu for core in cores[server_procs + client_cores:] for cpu in core}  # no sibling of theirs
    return CorePlan(servers, client, rest) if rest else None  # the bench's own sampling needs a core too


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` (a running process's threads keep their own masks) and what it starts later."""
    for thread in psutil.Process(pid).threads():
        try:
            os.sched_setaffinity(thread.id, cpus)
        except ProcessLookupError:  # a thread that has ended meanwhile
            pass
