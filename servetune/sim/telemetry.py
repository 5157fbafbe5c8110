"""What a simulated trial's telemetry would have shown: server metrics and the GPU memory curve.

Server metrics come from the same ``SimMetrics`` exposition the HTTP server serves, parsed the
way the Prometheus scraper parses a live server (before/after snapshots, periodic samples of the
scheduler gauges). The GPU curve is synthesized at the sampler's interval: SGLang preallocates
weights, the KV pool and CUDA graphs at start, so memory is flat apart from prefill activations;
utilisation is the busy share of each interval and power follows what ran in it (servetune.sim.power).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .args import SimArgs
from .metrics import SimMetrics
from .power import activity, watts
from .requests import Iteration, SimRequest
from .scheduler import Scheduler

CUDA_CONTEXT_BYTES = 512 << 20  # CUDA context + NCCL/cuBLAS workspaces, per GPU
ACTIVATION_BYTES_PER_TOKEN_PER_HIDDEN = 2 * 12  # bf16 x (qkv, attention out, MLP up/gate/down, ...)


def gpu_static_bytes(a: SimArgs) -> int:
    """What SGLang allocates per GPU at start: weights, the KV pool, CUDA context and graphs."""
    return int(a.weight_bytes_per_rank + a.kv_pool_bytes_per_rank + CUDA_CONTEXT_BYTES
               + a.cuda_graph_max_bs * (2 << 20))


def activation_bytes(a: SimArgs, new_tokens: int) -> int:
    """Transient activation memory of a prefill of ``new_tokens`` tokens, per GPU."""
    return int(new_tokens * a.model.hidden_size * ACTIVATION_BYTES_PER_TOKEN_PER_HIDDEN / max(a.tp_size, 1))


def parse_exposition(text: str) -> dict[str, Any]:
    """Exposition text -> the live scraper's snapshot shape (its own parser)."""
    from servetune.telemetry.prometheus import parse_metrics

    return parse_metrics(text)


class SimTelemetry:
    def __init__(self, args: SimArgs, sched: Scheduler, scrape_interval_s: float = 1.0):
        self.args = args
        self.sched = sched
        self.metrics = SimMetrics(args, sched)
        self.interval = scrape_interval_s
        self.next_sample = 0.0
        self.samples: list[dict[str, Any]] = []
        self.before = parse_exposition(self.metrics.exposition().decode())
        self.max_extend: list[tuple[float, float, int]] = []

    def restart(self, t: float) -> None:
        """The trial starts at ``t`` (after the cache was primed): counters and samples count from here."""
        self.before = parse_exposition(self.metrics.exposition().decode())
        self.samples.clear()
        self.next_sample = t

    def on_request_sent(self, r: SimRequest) -> None:  # noqa: ARG002 - hook kept for symmetry with the server
        return None

    def on_request_finished(self, r: SimRequest, t_recv: float, streaming: bool) -> None:
        self.metrics.on_request_finished(r, t_recv, streaming)

    def on_iteration(self, it: Iteration) -> None:
        if it.new_tokens:
            self.max_extend.append((it.start, it.end, it.new_tokens))

    def gauges(self) -> dict[str, float]:
        """The scheduler gauges the live scraper samples periodically, as of the last commit."""
        sc = self.sched
        return {
            "sglang:cache_hit_rate": sc.stats.last_cache_hit_rate,
            "sglang:gen_throughput": sc.last_decode_rate,
            "sglang:num_queue_reqs": float(sc.num_queue()),
            "sglang:num_retracted_reqs": float(sc.stats.last_retracted),
            "sglang:num_running_reqs": float(len(sc.running)),
            "sglang:num_used_tokens": float(sc.used_tokens()),
            "sglang:token_usage": sc.used_tokens() / self.args.max_total_num_tokens,
        }

    def advance(self, t: float) -> None:
        """Take the periodic samples due up to virtual time ``t`` (scraper shape: one row per gauge)."""
        if self.next_sample > t:
            return
        labels = self.metrics.sched_labels
        while self.next_sample <= t:
            ts = self.next_sample
            self.samples.extend(
                {"t_s": ts, "name": name, "labels": labels, "value": v} for name, v in self.gauges().items()
            )
            self.next_sample += self.interval

    def server_telemetry(self, end: float) -> dict[str, Any]:
        self.advance(end)
        after = parse_exposition(self.metrics.exposition().decode())
        return {
            "metrics_url": None,
            "metrics_state": "ok",
            "metrics_reason": "simulated: the sim engine's own exposition, sampled in virtual time",
            "interval_ms": self.interval * 1000.0,
            "metrics_before": self.before,
            "metrics_after": after,
            "samples": self.samples,
            "scrape_errors": 0,
            "server_info": {
                "version": "0.5.23-sim",
                "max_total_num_tokens": self.args.max_total_num_tokens,
                **self.args.server_args(),
            },
        }

    def gpu_curve(self, iterations: list[Iteration], end: float, interval_ms: float,
                  start: float = 0.0) -> dict[str, Any]:
        """Samples every ``interval_ms`` per TP rank from ``start``: memory (preallocated + activations), util,
        power."""
        a, g = self.args, self.args.gpu
        total = a.gpu_memory_bytes
        static = gpu_static_bytes(a)
        step = interval_ms / 1000.0
        grid = np.arange(start, end + step, step)
        if iterations:
            starts = np.fromiter((it.start for it in iterations), float, len(iterations))
            durs = np.fromiter((it.end - it.start for it in iterations), float, len(iterations))
            weights = np.fromiter((activity(g, it) for it in iterations), float, len(iterations))

            def until(x: np.ndarray, w: np.ndarray) -> np.ndarray:
                """Busy time (w = 1) or active time (w = activity) from the first pass up to each x."""
                cum = np.concatenate(([0.0], np.cumsum(durs * w)))
                idx = np.searchsorted(starts, x, side="right") - 1
                k = np.maximum(idx, 0)
                inside = np.where(idx >= 0, np.minimum(x - starts[k], durs[k]), 0.0)
                return np.where(idx >= 0, cum[k] + np.maximum(inside, 0.0) * w[k], 0.0)

            util = np.clip(np.diff(until(grid, np.ones_like(durs)), prepend=0.0) / step, 0.0, 1.0)
            active = np.clip(np.diff(until(grid, weights), prepend=0.0) / step, 0.0, 1.0)
        else:
            util = active = np.zeros_like(grid)
        act = np.zeros_like(grid)
        for s, e, n in self.max_extend:
            lo = int(np.searchsorted(grid, s, side="left"))
            hi = int(np.searchsorted(grid, e, side="left"))
            for k in range(lo, min(hi + 1, len(grid))):
                act[k] = max(act[k], activation_bytes(a, n))
        samples = []
        for k, t in enumerate(grid.tolist()):
            used = int(static + act[k])
            u, power = float(util[k]), round(watts(g, float(active[k])), 1)
            for rank in range(a.tp_size):
                samples.append({"t_s": t, "gpu": rank, "mem_used": used, "mem_total": total,
                                "util": round(u * 100.0, 1), "power_w": power})
        return {
            "state": "simulated",
            "interval_ms": interval_ms,
            "devices": [{"index": r, "name": f"{g.name} (simulated)", "uuid": f"SIM-{g.name}-{r}",
                         "mem_total": total, "power_limit_w": float(g.tdp_w)} for r in range(a.tp_size)],
            "processes_at_start": [],
            "samples": samples,
        }
