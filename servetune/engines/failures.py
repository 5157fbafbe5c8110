"""Why an engine did not come up (or went away), read from its log, so a failed trial carries a reason.

The patterns are the messages SGLang, vLLM, PyTorch and argparse actually print; the first match
in priority order wins (an argparse error explains everything after it, an OOM explains a crash).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import StrEnum


class FailureKind(StrEnum):
    cuda_oom = "cuda_oom"
    port_in_use = "port_in_use"
    bad_flag = "bad_flag"
    model_missing = "model_missing"
    timeout = "timeout"  # never became ready before the deadline
    exited = "exited"  # exited at start for a reason not recognised
    died = "died"  # was ready, then went away
    dirty_environment = "dirty_environment"  # preflight: the trial never started


_PATTERNS: list[tuple[FailureKind, re.Pattern[str]]] = [
    (FailureKind.bad_flag, re.compile(
        r"error: (unrecognized arguments|ambiguous option|argument --|the following arguments are required)"
        r"|invalid choice: |No such option: ")),
    (FailureKind.port_in_use, re.compile(
        r"address already in use|\[Errno 98\]|port \d+ is (already )?in use|port \d+ is not available",
        re.IGNORECASE)),
    (FailureKind.cuda_oom, re.compile(
        r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|cudaErrorMemoryAllocation"
        r"|Not enough memory\. Please try to increase --mem-fraction-static"
        r"|No available memory for the cache blocks|larger than the available KV cache memory"
        r"|insufficient memory for the KV cache", re.IGNORECASE)),
    (FailureKind.model_missing, re.compile(
        r"does not appear to have a file named config\.json|is not a local folder and is not a valid model"
        r"|Repo id must be|HFValidationError|LocalEntryNotFoundError|Can't load the configuration of"
        r"|Invalid repository ID or local directory|RepositoryNotFoundError"
        r"|model path .* (does not exist|not found)|No such file or directory: .*config\.json")),
]


Patterns = Sequence[tuple[FailureKind, re.Pattern[str]]]


def classify(lines: Sequence[str], patterns: Patterns = ()) -> FailureKind | None:
    """The known failure the log shows, or None; an engine's own ``patterns`` first, then the shared ones."""
    text = "\n".join(lines)
    for kind, pattern in [*patterns, *_PATTERNS]:
        if pattern.search(text):
            return kind
    return None


def first_match(lines: Sequence[str], kind: FailureKind, patterns: Patterns = ()) -> str | None:
    """The log line that gave ``kind`` away (for a one-line reason)."""
    candidates = [p for k, p in [*patterns, *_PATTERNS] if k == kind]
    for line in lines:
        if any(p.search(line) for p in candidates):
            return line.strip()
    return None


class EngineFailure(RuntimeError):
    """An engine that did not come up, or died; ``kind`` classified, ``log_tail`` its last log lines."""

    def __init__(self, kind: FailureKind, reason: str, log_tail: Sequence[str] = (), log_path: str | None = None):
        self.kind = kind
        self.reason = reason
        self.log_tail = list(log_tail)
        self.log_path = log_path
        super().__init__(f"{kind.value}: {reason}")

    def details(self) -> str:
        """The reason and the log tail, for a human."""
        where = f" (log: {self.log_path})" if self.log_path else ""
        if not self.log_tail:  # refused before the engine started (a taken port): no empty log block
            return f"{self}{where}"
        tail = "\n".join(self.log_tail)
        return f"{self}{where}\n--- last {len(self.log_tail)} log lines ---\n{tail}"


def failure_from_log(default: FailureKind, what: str, lines: Sequence[str], log_path: str | None = None, *,
                     patterns: Patterns = ()) -> EngineFailure:
    """An ``EngineFailure`` whose kind is what the log shows (the engine's own ``patterns`` first), else ``default``."""
    kind = classify(lines, patterns) or default
    hint = first_match(lines, kind, patterns)
    reason = f"{what}: {hint}" if hint else what
    return EngineFailure(kind, reason, lines, log_path)
