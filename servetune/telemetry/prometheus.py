"""The serving engine's own view of a trial, from its Prometheus ``/metrics``.

Counters are read before and after the trial, so the true prefix hit rate over the window is a
delta of ``cached_tokens`` over ``prompt_tokens`` (never the ``sglang:cache_hit_rate`` gauge,
which is overwritten per prefill batch; it is kept for contrast only). Scheduler gauges (running,
queued, token usage, retractions) are sampled periodically. Parsing is prometheus_client's own
parser; a server without ``/metrics`` yields a stated reason, never an exception in the trial.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)

# Families kept (names as prometheus_client reports them: counters without ``_total``).
SGLANG_FAMILIES = frozenset(
    "sglang:" + n
    for n in (
        # scheduler gauges
        "num_running_reqs", "num_queue_reqs", "gen_throughput", "cache_hit_rate", "token_usage",
        "num_used_tokens", "kv_available_tokens", "kv_evictable_tokens", "kv_used_tokens",
        "new_token_ratio", "num_retracted_reqs", "max_total_num_tokens", "context_len", "utilization",
        # scheduler counters and histogram
        "num_retracted_requests", "num_retracted_input_tokens", "num_retracted_output_tokens",
        "realtime_tokens", "prefill_effective_tokens", "evicted_tokens", "queue_time_seconds",
        # tokenizer manager counters and histograms
        "prompt_tokens", "generation_tokens", "num_requests", "cached_tokens", "num_aborted_requests",
        "time_to_first_token_seconds", "inter_token_latency_seconds", "request_time_per_output_token_seconds",
        "e2e_request_latency_seconds", "prompt_tokens_histogram", "uncached_prompt_tokens_histogram",
        "generation_tokens_histogram",
    )
)  # fmt: skip
VLLM_FAMILIES = frozenset(
    "vllm:" + n
    for n in (
        "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "gpu_cache_usage_perc",
        "prefix_cache_hits", "prefix_cache_queries", "num_preemptions", "prompt_tokens", "generation_tokens",
        "request_success", "time_to_first_token_seconds", "inter_token_latency_seconds",
        "time_per_output_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
    )
)  # fmt: skip
KEPT_FAMILIES = SGLANG_FAMILIES | VLLM_FAMILIES

# Gauges sampled every interval (sample names).
SAMPLED_GAUGES = frozenset(
    {
        "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:cache_hit_rate",
        "sglang:gen_throughput", "sglang:num_retracted_reqs", "sglang:num_used_tokens",
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
    }
)  # fmt: skip

# Labels that repeat one scheduler's value across ranks of one model replica.
_RANK_LABELS = ("tp_rank", "pp_rank", "moe_ep_rank")

Snapshot = dict[str, list[dict[str, Any]]]  # sample name -> [{labels, value}]


class MetricsUnavailable(RuntimeError):
    """``/metrics`` could not be read or parsed; the message says why."""


def parse_metrics(text: str, families: Iterable[str] = KEPT_FAMILIES) -> Snapshot:
    """Kept families of a Prometheus text exposition: sample name -> ``[{labels, value}]``.

    Counters keep their ``_total`` sample name; histograms keep ``_sum`` and ``_count`` (buckets
    and ``_created`` timestamps are dropped).
    """
    keep = frozenset(families)
    out: Snapshot = {}
    try:
        for family in text_string_to_metric_families(text):
            if family.name not in keep:
                continue
            for s in family.samples:
                if s.name.endswith(("_bucket", "_created", "_gsum", "_gcount")):
                    continue
                out.setdefault(s.name, []).append({"labels": dict(s.labels), "value": float(s.value)})
    except ValueError as exc:
        raise MetricsUnavailable(f"not a Prometheus text exposition: {exc}") from exc
    return out


def metrics_url(url: str) -> str:
    base = url.rstrip("/")
    return base if base.endswith("/metrics") else base + "/metrics"


class MetricsScraper:
    """Before/after snapshots and periodic gauge samples of one server's ``/metrics``.

    Either ``await run(stop_event)`` (returns when the event is set), or ``await start(t0_ns)``
    then ``await stop()``. Both produce the ``server`` part of a trial result::

        {metrics_url, metrics_state: ok|partial|unavailable, metrics_reason, interval_ms,
         metrics_before, metrics_after, samples: [{t_s, name, labels, value}], scrape_errors}
    """

    def __init__(
        self,
        url: str,
        interval_s: float = 1.0,
        *,
        t0_ns: int | None = None,
        timeout_s: float = 5.0,
        headers: dict[str, str] | None = None,
    ):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.url = metrics_url(url)
        self.interval_s = interval_s
        self.t0_ns = t0_ns
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._headers = {"Accept": "text/plain"} | dict(headers or {})  # may hold a key: never logged
        self._task: asyncio.Task[dict[str, Any]] | None = None
        self._stop_event: asyncio.Event | None = None

    async def snapshot(self, session: aiohttp.ClientSession | None = None) -> Snapshot:
        """One scrape, parsed; raises ``MetricsUnavailable``."""
        if session is None:
            async with aiohttp.ClientSession() as own:
                return await self.snapshot(own)
        try:
            async with session.get(self.url, headers=self._headers, timeout=self.timeout) as resp:
                body = await resp.text()
                if resp.status != 200:
                    hint = " (SGLang needs --enable-metrics)" if resp.status == 404 else ""
                    raise MetricsUnavailable(f"GET {self.url}: HTTP {resp.status}{hint}")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise MetricsUnavailable(f"GET {self.url}: {type(exc).__name__}: {exc}") from exc
        return parse_metrics(body)

    async def run(self, stop_event: asyncio.Event) -> dict[str, Any]:
        """Snapshot, sample gauges every ``interval_s`` until ``stop_event``, snapshot again."""
        t0 = self.t0_ns if self.t0_ns is not None else time.perf_counter_ns()
        result: dict[str, Any] = {
            "metrics_url": self.url,
            "metrics_state": "ok",
            "metrics_reason": None,
            "interval_ms": self.interval_s * 1000.0,
        }
        async with aiohttp.ClientSession() as session:
            try:
                before = await self.snapshot(session)
            except MetricsUnavailable as exc:
                log.info("server metrics off: %s", exc)
                return result | {"metrics_state": "unavailable", "metrics_reason": str(exc)}
            samples = _gauge_samples(before, (time.perf_counter_ns() - t0) / 1e9)
            errors = 0
            begin = time.perf_counter()
            k = 0
            while True:
                k += 1
                delay = begin + k * self.interval_s - time.perf_counter()
                if delay < 0:  # a slow scrape: skip missed ticks, keep the grid
                    k += int(-delay // self.interval_s) + 1
                    delay = begin + k * self.interval_s - time.perf_counter()
                try:
                    await asyncio.wait_for(stop_event.wait(), timeout=delay)
                    break
                except TimeoutError:
                    pass
                try:
                    snap = await self.snapshot(session)
                except MetricsUnavailable as exc:
                    errors += 1
                    result["metrics_reason"] = result["metrics_reason"] or str(exc)
                    continue
                samples.extend(_gauge_samples(snap, (time.perf_counter_ns() - t0) / 1e9))
            try:
                after: Snapshot | None = await self.snapshot(session)
                samples.extend(_gauge_samples(after, (time.perf_counter_ns() - t0) / 1e9))
            except MetricsUnavailable as exc:
                after = None
                result["metrics_state"] = "partial"
                result["metrics_reason"] = f"final snapshot: {exc}"
        if errors and result["metrics_state"] == "ok":
            result["metrics_state"] = "partial"
        return result | {
            "metrics_before": before,
            "metrics_after": after,
            "samples": samples,
            "scrape_errors": errors,
        }

    async def start(self, t0_ns: int | None = None) -> None:
        """Run in a background task until ``stop()``."""
        if self._task is not None:
            raise RuntimeError("MetricsScraper.start() called twice")
        if t0_ns is not None:
            self.t0_ns = t0_ns
        self._stop_event = asyncio.Event()
        self._task = asyncio.create_task(self.run(self._stop_event), name="servetune-metrics-scraper")
        await asyncio.sleep(0)  # let the first snapshot begin now, at the trial's start

    async def stop(self) -> dict[str, Any]:
        if self._task is None or self._stop_event is None:
            raise RuntimeError("MetricsScraper.stop() without start()")
        self._stop_event.set()
        return await self._task


def _gauge_samples(snap: Snapshot, t_s: float) -> list[dict[str, Any]]:
    return [
        {"t_s": t_s, "name": name, "labels": s["labels"], "value": s["value"]}
        for name in sorted(SAMPLED_GAUGES & snap.keys())
        for s in snap[name]
    ]


# --- signals -------------------------------------------------------------------------------
def _key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _counter_delta(
    before: Snapshot, after: Snapshot, name: str, where: dict[str, str] | None = None
) -> float | None:
    """Sum over series of after - before (a series new in ``after`` started at 0); None if absent
    or if any series went backwards (a restarted server)."""
    if name not in after:
        return None
    prev = {_key(s["labels"]): s["value"] for s in before.get(name, [])}
    total = 0.0
    for s in after[name]:
        if where and any(s["labels"].get(k) != v for k, v in where.items()):
            continue
        d = s["value"] - prev.get(_key(s["labels"]), 0.0)
        if d < 0:
            return None
        total += d
    return total


def _cached_tokens_delta(before: Snapshot, after: Snapshot) -> float | None:
    name = "sglang:cached_tokens_total"
    sources = {s["labels"].get("cache_source") for s in after.get(name, [])}
    if "total" in sources:
        return _counter_delta(before, after, name, {"cache_source": "total"})
    return _counter_delta(before, after, name)  # device + host + storage


def _combine(series: list[dict[str, Any]], how: str) -> float:
    """One value from a gauge's series at one time: ranks of one replica collapse by max,
    replicas (dp ranks, models) then add up (``how='sum'``) or take the max."""
    per_replica: dict[tuple, float] = {}
    for s in series:
        rep = _key({k: v for k, v in s["labels"].items() if k not in _RANK_LABELS})
        per_replica[rep] = max(per_replica.get(rep, float("-inf")), s["value"])
    return sum(per_replica.values()) if how == "sum" else max(per_replica.values())


def _timeline(samples: list[dict[str, Any]], names: tuple[str, ...], how: str) -> list[float]:
    """Per scrape time, the combined value of the first of ``names`` that was sampled."""
    for name in names:
        by_t: dict[float, list[dict[str, Any]]] = defaultdict(list)
        for s in samples:
            if s["name"] == name:
                by_t[s["t_s"]].append(s)
        if by_t:
            return [_combine(by_t[t], how) for t in sorted(by_t)]
    return []


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def derive_signals(server: dict[str, Any], *, window: tuple[float, float] | None = None) -> dict[str, Any]:
    """The summary's server-side figures from a scraper's output (pure; missing data -> None).

    Counters are deltas over the whole trial; the gauges (running, queued, token usage) use the
    scrapes inside ``window`` when there are any, so they describe the same span as the summary.
    """
    before: Snapshot = server.get("metrics_before") or {}
    after: Snapshot = server.get("metrics_after") or {}
    all_samples: list[dict[str, Any]] = server.get("samples") or []
    samples = all_samples
    if window is not None:
        inside = [x for x in all_samples if window[0] <= x["t_s"] <= window[1]]
        samples = inside or all_samples
    out: dict[str, Any] = {
        "prefix_hit_rate_server": None,
        "prefix_hit_rate_source": None,
        "cache_hit_rate_gauge": None,
        "token_usage_max": None,
        "queue_reqs_max": None,
        "queue_reqs_mean": None,
        "running_reqs_mean": None,
        "retractions": None,
        "retractions_source": None,
        "server_ttft_mean_s": None,
        "server_itl_mean_s": None,
        "samples": len({x["t_s"] for x in all_samples}),
        "samples_in_window": len({x["t_s"] for x in samples}) if samples is not all_samples else 0,
    }
    if not before and not after:
        out["reason"] = server.get("metrics_reason") or "no /metrics snapshots"
        return out
    if after:
        if "sglang:prompt_tokens_total" in after:
            out["prefix_hit_rate_server"] = _ratio(
                _cached_tokens_delta(before, after),
                _counter_delta(before, after, "sglang:prompt_tokens_total"),
            )
            out["prefix_hit_rate_source"] = "sglang:cached_tokens_total/sglang:prompt_tokens_total"
        elif "vllm:prefix_cache_queries_total" in after:
            out["prefix_hit_rate_server"] = _ratio(
                _counter_delta(before, after, "vllm:prefix_cache_hits_total"),
                _counter_delta(before, after, "vllm:prefix_cache_queries_total"),
            )
            out["prefix_hit_rate_source"] = "vllm:prefix_cache_hits_total/vllm:prefix_cache_queries_total"
        for name in ("sglang:num_retracted_requests_total", "vllm:num_preemptions_total"):
            if name in after:
                out["retractions"] = _counter_delta(before, after, name)
                out["retractions_source"] = name
                break
        for prefix, key in (
            ("time_to_first_token_seconds", "server_ttft_mean_s"),
            ("inter_token_latency_seconds", "server_itl_mean_s"),
        ):
            for engine in ("sglang:", "vllm:"):
                total = _counter_delta(before, after, f"{engine}{prefix}_sum")
                count = _counter_delta(before, after, f"{engine}{prefix}_count")
                if total is not None:
                    out[key] = _ratio(total, count)
                    break
    if out["retractions"] is None:
        gauge = _timeline(samples, ("sglang:num_retracted_reqs",), "sum")
        if gauge:
            out["retractions"] = max(gauge[-1] - gauge[0], 0.0)
            out["retractions_source"] = "sglang:num_retracted_reqs (gauge, last - first)"
    hit = _timeline(samples, ("sglang:cache_hit_rate",), "max")
    out["cache_hit_rate_gauge"] = hit[-1] if hit else None
    usage = _timeline(
        samples, ("sglang:token_usage", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), "max"
    )
    out["token_usage_max"] = max(usage) if usage else None
    queue = _timeline(samples, ("sglang:num_queue_reqs", "vllm:num_requests_waiting"), "sum")
    if queue:
        out["queue_reqs_max"] = max(queue)
        out["queue_reqs_mean"] = sum(queue) / len(queue)
    running = _timeline(samples, ("sglang:num_running_reqs", "vllm:num_requests_running"), "sum")
    if running:
        out["running_reqs_mean"] = sum(running) / len(running)
    return out
