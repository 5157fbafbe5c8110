"""servetune.loadgen: stream a workload at a target, one RequestRecord per request."""

from .client import LoadOutcome, TargetUnreachable, run_load, run_load_sync
from .config import LoadConfig, Target

__all__ = ["LoadConfig", "LoadOutcome", "Target", "TargetUnreachable", "run_load", "run_load_sync"]
