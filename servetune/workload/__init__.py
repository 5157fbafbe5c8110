"""servetune.workload: which requests to send, deterministic by seed (see docs/workload.md)."""

from servetune.workload.generator import GENERATOR_VERSION, WorkloadBatch, build_requests
from servetune.workload.presets import PRESETS, get_preset
from servetune.workload.request import WorkloadRequest
from servetune.workload.spec import WorkloadSpec
from servetune.workload.tokenizer import Tokenizer, load_tokenizer

__all__ = [
    "GENERATOR_VERSION",
    "PRESETS",
    "Tokenizer",
    "WorkloadBatch",
    "WorkloadRequest",
    "WorkloadSpec",
    "build_requests",
    "get_preset",
    "load_tokenizer",
]
