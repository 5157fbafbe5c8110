"""Where the DAGs find plans and write results; the GPU runners (pools, queues) of the plans there
(servetune.gpu_pools names them).

Read at DAG-parse time, so it stays cheap: plan files are parsed, no server is contacted.
"""

from __future__ import annotations

import os
from pathlib import Path

from servetune import gpu_pools as pools
from servetune.gpu_pools import GpuRunner, runner_of

__all__ = ["WAREHOUSE_CONN_ID", "GpuRunner", "plan_files", "plans_dir", "results_dir", "runner_of", "runners"]

REPO = Path(__file__).resolve().parents[1]
WAREHOUSE_CONN_ID = "servetune_warehouse"


def plans_dir() -> Path:
    return Path(os.environ.get("SERVETUNE_PLANS_DIR", REPO / "plans" / "weekly"))


def results_dir() -> Path:
    return Path(os.environ.get("SERVETUNE_RESULTS_DIR", REPO / ".servetune" / "results"))


def plan_files(folder: Path | None = None) -> list[Path]:
    return pools.plan_files(folder or plans_dir())


def runners(folder: Path | None = None) -> dict[str, GpuRunner]:
    return pools.runners(folder or plans_dir())
