"""servetune.loadgen: stream a workload at a target, one RequestRecord per request."""

from .client import LoadOutcome, TargetUnreachable, run_load, run_load_sync
from .config import LoadConfig, Target
from .idle import IDLE_TIMEOUT

__all__ = ["IDLE_TIMEOUT", "LoadConfig", "LoadOutcome", "Target", "TargetUnreachable", "run_load", "run_load_sync"]
