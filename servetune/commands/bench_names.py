"""``servetune bench``'s error lines name the option the user typed (``--warmup``), not the trial request's
field (``load.warmup_requests``)."""

from __future__ import annotations

_CLI_NAMES = {
    "load.concurrency": "--concurrency",
    "load.rate": "--rate",
    "load.arrival": "--arrival",
    "load.burstiness": "--burstiness",
    "load.warmup_requests": "--warmup",
    "load.prime_cache": "--prime/--no-prime",
    "target.url": "--url",
    "target.endpoint": "--endpoint",
    "target.timeout_s": "--timeout-s",
    "target.http_client": "--http-client",
    "target.read_batch_ms": "--read-batch-ms",
    "target.idle_timeout_s": "--idle-timeout",
    "num_requests": "--requests",
    "gpu_interval_ms": "--gpu-interval-ms",
    "validity.min_window_s": "--min-window-s",
    "validity.min_completions": "--min-completions",
}


def cli_names(line: str) -> str:
    """Name the option the user typed, not our internal field path."""
    for field, option in _CLI_NAMES.items():
        line = line.replace(f"{field}:", f"{option}:")
    return line
