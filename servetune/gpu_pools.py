"""GPU runners as the scheduler sees them: one per GPU host (or GPU set) that runs one trial at a time.

A plan's runner section names its runner (kind, host, GPUs) and its GPU type picks a work queue; the
Airflow side (servetune_airflow) turns each into a one-slot pool and a Celery queue, and `servetune demo`
creates the same pools, so both name them here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from servetune.plan import TuningPlan, load_plan


@dataclass(frozen=True)
class GpuRunner:
    """One GPU host (or GPU set) that runs one trial at a time."""

    name: str  # e.g. "local", "ssh-gpu-host-3-gpus-0-1"
    queue: str  # Celery queue: one per GPU type, each GPU host runs a worker on its queue

    @property
    def pool(self) -> str:
        return f"servetune-{self.name}"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def runner_of(plan: TuningPlan) -> GpuRunner:
    """The GPU runner a plan uses, named by its kind, host and GPUs; its GPU type picks the Celery queue."""
    r = plan.runner
    parts = [r.kind]
    host = getattr(r, "host", None)
    if host and host not in ("127.0.0.1", "localhost"):
        parts.append(host)
    gpus = getattr(r, "gpus", None)
    if isinstance(gpus, list) and gpus:
        parts.append("gpus-" + "-".join(map(str, gpus)))
    queue = f"gpu-{r.gpu_type}" if r.gpu_type else "default"
    return GpuRunner(name=_slug("-".join(parts)), queue=queue)


def plan_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.y*ml") if p.suffix in (".yaml", ".yml"))


def runners(folder: Path) -> dict[str, GpuRunner]:
    """Every GPU runner the plans in the folder use (plans that fail to parse are skipped here;
    the campaign's own prepare task reports them with the field path)."""
    found = {"local": GpuRunner("local", "default")}
    for path in plan_files(folder):
        try:
            r = runner_of(load_plan(path))
        except Exception:  # noqa: BLE001 - reported by the task that runs the plan
            continue
        found[r.name] = r
    return found


def runner_pools(folder: Path) -> list[tuple[str, int, str]]:
    """(pool, slots, description) for `airflow pools set`: one slot, so no two trials share a GPU."""
    return [(r.pool, 1, f"servetune GPU runner {r.name} (queue {r.queue})") for r in runners(folder).values()]
