"""The simulated scheduler's batch log: the same "Prefill batch" / "Decode batch" lines SGLang 0.5 prints.

One line per prefill batch and one per ``DECODE_LOG_INTERVAL`` decode steps (SGLang's
``--decode-log-interval`` default), with the fields servetune.telemetry.scheduler_log reads, so
the parser and everything downstream of it run against ``servetune sim serve`` without a GPU.
"""

from __future__ import annotations

import logging

from .args import SimArgs
from .requests import Iteration
from .scheduler import Scheduler

DECODE_LOG_INTERVAL = 40
log = logging.getLogger("servetune.sim.scheduler")


class BatchLog:
    """Formats and logs the scheduler's batch lines as the iterations are planned."""

    def __init__(self, args: SimArgs, sched: Scheduler, *, interval: int = DECODE_LOG_INTERVAL) -> None:
        self.args, self.sched, self.interval = args, sched, interval
        self._decodes = 0
        self._tokens = 0
        self._since = 0.0

    def on_iteration(self, it: Iteration) -> None:
        sc = self.sched
        usage = sc.used_tokens() / self.args.max_total_num_tokens
        duration = max(it.end - it.start, 1e-9)
        if it.kind == "prefill":
            log.info("Prefill batch, #new-seq: %d, #new-token: %d, #cached-token: %d, token usage: %.2f,"
                     " #running-req: %d, #queue-req: %d, #pending-token: 0, cuda graph: False,"
                     " input throughput (token/s): %.2f", it.batch_size, it.new_tokens, it.cached_tokens, usage,
                     max(len(sc.running) - it.batch_size, 0), sc.num_queue(), it.new_tokens / duration)
            return
        if self._decodes == 0:
            self._since = it.start
        self._decodes += 1
        self._tokens += it.batch_size
        if self._decodes >= self.interval:
            rate = self._tokens / max(it.end - self._since, 1e-9)
            log.info("Decode batch, #running-req: %d, #token: %d, token usage: %.2f, cuda graph: True,"
                     " gen throughput (token/s): %.2f, #queue-req: %d", len(sc.running), sc.used_tokens(), usage,
                     rate, sc.num_queue())
            self._decodes = self._tokens = 0
