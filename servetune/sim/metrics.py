"""The ``sglang:`` Prometheus exposition of the simulated server (names, types, labels of 0.5.23).

A custom prometheus_client Collector in a dedicated CollectorRegistry: scheduler gauges are read
live from the Scheduler at scrape time (as SGLang's scheduler publishes its current state), the
tokenizer-side counters and histograms are fed per finished request. Histograms keep plain bucket
counts so the virtual-time driver can add a request's per-token latencies in one numpy call.
Bucket bounds are those of sglang-metrics-sample-0.5.23.txt.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from .args import SimArgs
from .requests import SimRequest
from .scheduler import Scheduler

LATENCY_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
                   200.0, 400.0)
E2E_BUCKETS = LATENCY_BUCKETS + (600.0, 1200.0, 1800.0, 2400.0)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1,
               0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)
QUEUE_BUCKETS = (0.0, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                 70.0, 80.0, 90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 1200.0, 1800.0, 2400.0)
TOKEN_BUCKETS = (100.0, 300.0, 500.0, 700.0, 1000.0, 1500.0, 2000.0, 3000.0, 4000.0, 5000.0, 6000.0, 7000.0,
                 8000.0, 9000.0, 10000.0, 12500.0, 15000.0, 17500.0, 20000.0, 22500.0, 25000.0, 27500.0,
                 30000.0, 35000.0, 40000.0, 60000.0, 80000.0, 100000.0, 200000.0, 300000.0, 400000.0,
                 600000.0, 800000.0, 1e6, 1.1e6)


class Hist:
    """One histogram series: cumulative-ready bucket counts and a sum."""

    __slots__ = ("bounds", "counts", "sum", "_arr")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self._arr = np.asarray(bounds)
        self.counts = [0] * (len(bounds) + 1)  # last: above the largest bound (+Inf only)
        self.sum = 0.0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1
        self.sum += v

    def observe_many(self, values: np.ndarray) -> None:
        if values.size == 0:
            return
        idx = np.searchsorted(self._arr, values, side="left")
        for i, c in zip(*np.unique(idx, return_counts=True), strict=True):
            self.counts[int(i)] += int(c)
        self.sum += float(values.sum())

    def family_buckets(self) -> list[tuple[str, float]]:
        out, acc = [], 0
        for b, c in zip(self.bounds, self.counts, strict=False):
            acc += c
            out.append((_le(b), acc))
        out.append(("+Inf", acc + self.counts[-1]))
        return out


def _le(b: float) -> str:
    return repr(float(b)) if b < 1e6 else f"{b:g}"


class SimMetrics(Collector):
    """Everything ``/metrics`` shows; ``registry`` is dedicated to this server."""

    def __init__(self, args: SimArgs, sched: Scheduler):
        self.args = args
        self.sched = sched
        model = args.served_model_name
        self.sched_labels = {"engine_type": "unified", "model_name": model, "moe_ep_rank": "0", "pp_rank": "0",
                             "tp_rank": "0"}
        self.tok_labels = {"engine_type": "unified", "model_name": model}
        # tokenizer-side, per is_streaming ("true"/"false")
        self.prompt_tokens: dict[str, int] = {}
        self.generation_tokens: dict[str, int] = {}
        self.num_requests: dict[str, int] = {}
        self.cached_tokens = 0
        self.aborted = 0
        self.ttft: dict[str, Hist] = {}
        self.e2e: dict[str, Hist] = {}
        self.tpot: dict[str, Hist] = {}
        self.itl = Hist(ITL_BUCKETS)
        self.queue = Hist(QUEUE_BUCKETS)
        self.prompt_hist = Hist(TOKEN_BUCKETS)
        self.uncached_hist = Hist(TOKEN_BUCKETS)
        self.gen_hist = Hist(TOKEN_BUCKETS)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    # --- feeding ------------------------------------------------------------------------

    def on_request_finished(self, r: SimRequest, t_recv: float, streaming: bool) -> None:
        """A request's tokenizer-side figures, at the modelled times (t_recv: when it arrived)."""
        s = "true" if streaming else "false"
        self.prompt_tokens[s] = self.prompt_tokens.get(s, 0) + r.prompt_len
        self.generation_tokens[s] = self.generation_tokens.get(s, 0) + r.output_len
        self.num_requests[s] = self.num_requests.get(s, 0) + 1
        cached = r.cached_tokens or 0
        self.cached_tokens += cached
        times = r.token_times
        if times:
            self.ttft.setdefault(s, Hist(LATENCY_BUCKETS)).observe(times[0] - t_recv)
            if len(times) > 1:
                gaps = np.diff(np.asarray(times))
                self.itl.observe_many(gaps)
                self.tpot.setdefault(s, Hist(ITL_BUCKETS)).observe((times[-1] - times[0]) / (len(times) - 1))
        if r.finished_at is not None:
            self.e2e.setdefault(s, Hist(E2E_BUCKETS)).observe(r.finished_at - t_recv)
        if r.first_scheduled is not None:
            self.queue.observe(max(r.first_scheduled - r.arrival, 0.0))  # the front end's time is not queue time
        self.prompt_hist.observe(r.prompt_len)
        self.uncached_hist.observe(r.prompt_len - cached)
        self.gen_hist.observe(r.output_len)

    def on_abort(self) -> None:
        self.aborted += 1

    # --- exposition -----------------------------------------------------------------------

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=list(self.sched_labels))
        g.add_metric(list(self.sched_labels.values()), value)
        return g

    def _sched_counter(
        self, name: str, doc: str, values: Iterable[tuple[dict[str, str], float]]
    ) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=None)
        for extra, v in values:
            c.samples.append(_sample(name + "_total", {**self.sched_labels, **extra}, v))
        return c

    def _tok_counter(self, name: str, doc: str, by_stream: dict[str, int]) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=["engine_type", "is_streaming", "model_name"])
        for s, v in sorted(by_stream.items()):
            c.add_metric([self.tok_labels["engine_type"], s, self.tok_labels["model_name"]], v)
        return c

    def _hist(self, name: str, doc: str, series: Iterable[tuple[dict[str, str], Hist]]) -> HistogramMetricFamily:
        h = HistogramMetricFamily(name, doc, labels=None)
        for labels, hist in series:
            h.samples.extend(_hist_samples(name, labels, hist))
        return h

    def collect(self) -> Iterator:
        sc, a = self.sched, self.args
        pool = a.max_total_num_tokens
        used = sc.used_tokens()
        evictable = sc.tree.evictable_size
        st = sc.stats
        yield self._gauge("sglang:num_running_reqs", "The number of running requests.", len(sc.running))
        yield self._gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", sc.num_queue())
        yield self._gauge("sglang:gen_throughput", "The generation throughput (token/s).", sc.last_decode_rate)
        yield self._gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", st.last_cache_hit_rate)
        yield self._gauge("sglang:token_usage", "The token usage.", used / pool)
        yield self._gauge("sglang:num_used_tokens", "The number of used tokens.", used)
        yield self._gauge("sglang:kv_available_tokens", "Number of free token slots in the KV cache pool.",
                          max(sc.free, 0))
        yield self._gauge("sglang:kv_evictable_tokens",
                          "Number of evictable (radix-cached) token slots in the KV cache pool.", evictable)
        yield self._gauge("sglang:kv_used_tokens", "Number of actively used token slots in the KV cache pool.", used)
        yield self._gauge("sglang:new_token_ratio", "The new token ratio.", sc.new_token_ratio)
        yield self._gauge("sglang:num_retracted_reqs", "The number of retracted requests.", st.last_retracted)
        yield self._gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", pool)
        yield self._gauge("sglang:context_len", "Maximum context length.", a.context_length)
        yield self._gauge("sglang:page_size", "KV cache page size in tokens.", a.page_size)
        yield self._gauge("sglang:weight_memory_usage_gb", "Memory used by model weights in GB.",
                          a.weight_bytes_per_rank / 1e9)
        yield self._gauge("sglang:kv_cache_memory_usage_gb", "Memory used by the KV cache pools in GB.",
                          a.kv_pool_bytes_per_rank / 1e9)
        yield self._sched_counter("sglang:num_retracted_requests", "Total number of retracted requests.",
                                  [({}, st.retracted_requests)])
        yield self._sched_counter("sglang:num_retracted_input_tokens", "Total number of retracted input tokens.",
                                  [({}, st.retracted_input_tokens)])
        yield self._sched_counter("sglang:num_retracted_output_tokens", "Total number of retracted output tokens.",
                                  [({}, st.retracted_output_tokens)])
        yield self._sched_counter(
            "sglang:realtime_tokens",
            "Total number of tokens processed (updated on each log interval). mode: prefill_compute, "
            "prefill_cache, decode.",
            [({"mode": "prefill_compute"}, st.prefill_compute_tokens),
             ({"mode": "prefill_cache"}, st.prefill_cache_tokens),
             ({"mode": "decode"}, st.decode_tokens)],
        )
        yield self._sched_counter(
            "sglang:prefill_effective_tokens",
            "Effective prefill tokens with retracted-request re-counts excluded. mode: device_hit, host_hit, "
            "storage_hit, input.",
            [({"mode": "input"}, st.prompt_tokens - st.cached_tokens), ({"mode": "device_hit"}, st.cached_tokens),
             ({"mode": "host_hit"}, 0), ({"mode": "storage_hit"}, 0)],
        )
        yield self._tok_counter("sglang:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens)
        yield self._tok_counter("sglang:generation_tokens", "Number of generation tokens processed.",
                                self.generation_tokens)
        yield self._tok_counter("sglang:num_requests", "Number of requests processed.", self.num_requests)
        cached = CounterMetricFamily("sglang:cached_tokens",
                                     "Number of cached prompt tokens by source (device/host/storage).",
                                     labels=["cache_source", "engine_type", "model_name"])
        for src in ("device", "total"):
            cached.add_metric([src, self.tok_labels["engine_type"], self.tok_labels["model_name"]], self.cached_tokens)
        yield cached
        aborted = CounterMetricFamily("sglang:num_aborted_requests", "Number of requests aborted.",
                                      labels=list(self.tok_labels))
        aborted.add_metric(list(self.tok_labels.values()), self.aborted)
        yield aborted
        tl = self.tok_labels
        yield self._hist("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         [({**tl, "is_streaming": s}, h) for s, h in sorted(self.ttft.items())])
        yield self._hist("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                         [(tl, self.itl)])
        yield self._hist(
            "sglang:request_time_per_output_token_seconds",
            "Per-request TPOT in seconds: (finished_time - first_token_time) / (completion_tokens - 1).",
            [({**tl, "is_streaming": s}, h) for s, h in sorted(self.tpot.items())],
        )
        yield self._hist("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
                         [({**tl, "is_streaming": s}, h) for s, h in sorted(self.e2e.items())])
        yield self._hist("sglang:queue_time_seconds", "Histogram of queueing time in seconds.",
                         [(self.sched_labels, self.queue)])
        yield self._hist("sglang:prompt_tokens_histogram", "Histogram of prompt token length.",
                         [(tl, self.prompt_hist)])
        yield self._hist("sglang:uncached_prompt_tokens_histogram",
                         "Histogram of uncached (compute) prompt token length.", [(tl, self.uncached_hist)])
        yield self._hist("sglang:generation_tokens_histogram", "Histogram of generation token length.",
                         [(tl, self.gen_hist)])


def _sample(name: str, labels: dict[str, str], value: float):
    from prometheus_client.samples import Sample

    return Sample(name, dict(sorted(labels.items())), value, None, None)


def _hist_samples(name: str, labels: dict[str, str], h: Hist) -> list:
    out = []
    for le, c in h.family_buckets():
        out.append(_sample(name + "_bucket", {**labels, "le": le}, c))
    out.append(_sample(name + "_count", labels, h.family_buckets()[-1][1]))
    out.append(_sample(name + "_sum", labels, h.sum))
    return out
