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
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from servetune.limits import MAX_METRICS_BYTES, ResponseTooLarge, read_body

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Dialect:
    """One engine family's metric names: what to keep, sample, and read each summary figure from.

    An engine config names its dialect by prefix (``EngineBase.metric_prefix``); the telemetry layer
    cannot import the engines (they sit above it), so the dialects live here, keyed by that prefix.
    Names are as prometheus_client reports them: families of counters without ``_total``, samples with it.
    """

    prefix: str
    families: frozenset[str]
    gauges: frozenset[str]  # sampled every interval (sample names)
    hits: str | None = None  # prefix-cache hits counter and its denominator (sample names)
    queries: str | None = None
    hits_total_label: tuple[str, str] | None = None  # the label value that already sums the hits' sources
    retractions: str | None = None  # counter
    retractions_gauge: str | None = None  # fallback when the counter is absent (last - first)
    hit_rate_gauge: str | None = None  # kept for contrast only
    usage: tuple[str, ...] = ()  # KV-cache usage gauges, first present wins
    queue: tuple[str, ...] = ()
    running: tuple[str, ...] = ()


def _names(prefix: str, names: str) -> frozenset[str]:
    return frozenset(prefix + n for n in names.split())


DIALECTS: dict[str, Dialect] = {
    "sglang:": Dialect(
        prefix="sglang:",
        families=_names("sglang:", """
            num_running_reqs num_queue_reqs gen_throughput cache_hit_rate token_usage
            num_used_tokens kv_available_tokens kv_evictable_tokens kv_used_tokens
            new_token_ratio num_retracted_reqs max_total_num_tokens context_len utilization
            num_retracted_requests num_retracted_input_tokens num_retracted_output_tokens
            realtime_tokens prefill_effective_tokens evicted_tokens queue_time_seconds
            prompt_tokens generation_tokens num_requests cached_tokens num_aborted_requests
            time_to_first_token_seconds inter_token_latency_seconds request_time_per_output_token_seconds
            e2e_request_latency_seconds prompt_tokens_histogram uncached_prompt_tokens_histogram
            generation_tokens_histogram"""),  # scheduler gauges, counters, histogram; tokenizer manager's
        gauges=_names("sglang:", "num_running_reqs num_queue_reqs token_usage cache_hit_rate gen_throughput"
                                 " num_retracted_reqs num_used_tokens"),
        hits="sglang:cached_tokens_total", queries="sglang:prompt_tokens_total",
        hits_total_label=("cache_source", "total"),  # else device + host + storage
        retractions="sglang:num_retracted_requests_total", retractions_gauge="sglang:num_retracted_reqs",
        hit_rate_gauge="sglang:cache_hit_rate", usage=("sglang:token_usage",), queue=("sglang:num_queue_reqs",),
        running=("sglang:num_running_reqs",)),
    "vllm:": Dialect(
        prefix="vllm:",
        families=_names("vllm:", """
            num_requests_running num_requests_waiting kv_cache_usage_perc gpu_cache_usage_perc
            prefix_cache_hits prefix_cache_queries num_preemptions prompt_tokens generation_tokens
            request_success time_to_first_token_seconds inter_token_latency_seconds
            time_per_output_token_seconds e2e_request_latency_seconds request_queue_time_seconds"""),
        gauges=_names("vllm:", "num_requests_running num_requests_waiting kv_cache_usage_perc gpu_cache_usage_perc"),
        hits="vllm:prefix_cache_hits_total", queries="vllm:prefix_cache_queries_total",
        retractions="vllm:num_preemptions_total",
        usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), queue=("vllm:num_requests_waiting",),
        running=("vllm:num_requests_running",)),
}
SGLANG_FAMILIES = DIALECTS["sglang:"].families
VLLM_FAMILIES = DIALECTS["vllm:"].families
KEPT_FAMILIES = frozenset().union(*(d.families for d in DIALECTS.values()))
SAMPLED_GAUGES = frozenset().union(*(d.gauges for d in DIALECTS.values()))  # gauges sampled every interval

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
                body = (await read_body(resp, MAX_METRICS_BYTES, f"GET {self.url}")).decode("utf-8", "replace")
                if resp.status != 200:
                    hint = " (SGLang needs --enable-metrics)" if resp.status == 404 else ""
                    raise MetricsUnavailable(f"GET {self.url}: HTTP {resp.status}{hint}")
        except ResponseTooLarge as exc:
            raise MetricsUnavailable(str(exc)) from exc
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


def _hits_delta(before: Snapshot, after: Snapshot, d: Dialect) -> float | None:
    assert d.hits is not None
    if d.hits_total_label:
        key, total = d.hits_total_label
        if total in {s["labels"].get(key) for s in after.get(d.hits, [])}:
            return _counter_delta(before, after, d.hits, {key: total})
    return _counter_delta(before, after, d.hits)  # the sum over its series


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
        "server_queue_mean_s": None,
        "samples": len({x["t_s"] for x in all_samples}),
        "samples_in_window": len({x["t_s"] for x in samples}) if samples is not all_samples else 0,
    }
    if not before and not after:
        out["reason"] = server.get("metrics_reason") or "no /metrics snapshots"
        return out
    dialects = list(DIALECTS.values())
    if after:
        for d in dialects:
            if d.hits and d.queries and d.queries in after:
                out["prefix_hit_rate_server"] = _ratio(_hits_delta(before, after, d),
                                                       _counter_delta(before, after, d.queries))
                out["prefix_hit_rate_source"] = f"{d.hits}/{d.queries}"
                break
        for name in [d.retractions for d in dialects if d.retractions]:
            if name in after:
                out["retractions"] = _counter_delta(before, after, name)
                out["retractions_source"] = name
                break
        for prefix, key in (
            ("time_to_first_token_seconds", "server_ttft_mean_s"),
            ("inter_token_latency_seconds", "server_itl_mean_s"),
            ("queue_time_seconds", "server_queue_mean_s"),
        ):
            for d in dialects:
                total = _counter_delta(before, after, f"{d.prefix}{prefix}_sum")
                count = _counter_delta(before, after, f"{d.prefix}{prefix}_count")
                if total is not None:
                    out[key] = _ratio(total, count)
                    break
    if out["retractions"] is None:
        for name in [d.retractions_gauge for d in dialects if d.retractions_gauge]:
            gauge = _timeline(samples, (name,), "sum")
            if gauge:
                out["retractions"] = max(gauge[-1] - gauge[0], 0.0)
                out["retractions_source"] = f"{name} (gauge, last - first)"
                break
    hit = _timeline(samples, tuple(d.hit_rate_gauge for d in dialects if d.hit_rate_gauge), "max")
    out["cache_hit_rate_gauge"] = hit[-1] if hit else None
    usage = _timeline(samples, tuple(n for d in dialects for n in d.usage), "max")
    out["token_usage_max"] = max(usage) if usage else None
    queue = _timeline(samples, tuple(n for d in dialects for n in d.queue), "sum")
    if queue:
        out["queue_reqs_max"] = max(queue)
        out["queue_reqs_mean"] = sum(queue) / len(queue)
    running = _timeline(samples, tuple(n for d in dialects for n in d.running), "sum")
    if running:
        out["running_reqs_mean"] = sum(running) / len(running)
    return out
