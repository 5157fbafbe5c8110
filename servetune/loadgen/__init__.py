"""servetune.loadgen: stream a workload at a target, one RequestRecord per request."""

from typing import Any

from .config import LoadConfig, Target
from .idle import IDLE_TIMEOUT

__all__ = ["IDLE_TIMEOUT", "LoadConfig", "LoadOutcome", "Target", "TargetUnreachable", "run_load", "run_load_sync"]
_CLIENT = frozenset({"LoadOutcome", "TargetUnreachable", "run_load", "run_load_sync"})


def __getattr__(name: str) -> Any:
    """The client's names, imported on first use: aiohttp and the workload generator (0.2 s) wait until a load
    runs, so a module that only reads a LoadConfig (a DAG file parsing its plans) does not pay for them."""
    if name in _CLIENT:
        from . import client

        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
