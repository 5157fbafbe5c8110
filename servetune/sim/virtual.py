"""Virtual time: run a whole workload through the scheduler model without waiting for it.

``simulate`` follows the load generator's semantics (servetune.loadgen): one load over all
requests, the warm-up ones first, either a closed loop (each stream sends its next request the
moment its previous one ends) or an open loop (arrival offsets from
``loadgen.strategies.arrival_offsets_s``, capped in flight; lateness becomes ``queue_ms``). It returns a
TrialResult of the same shape as a measured trial, with ``target.engine = "sim"``: records, a synthesized GPU
memory curve, server metrics in the scraper's shape, and the summary from ``servetune.metrics.summarize``.
Deterministic: the same inputs give the same result (``seed`` only feeds the open-loop arrivals via ``load.seed`` when
``load.seed`` is left at 0). A sent request reaches the scheduler when the model's front end is done
with it (servetune.sim.frontend; at once for a profile without one).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from servetune.energy import Cost
from servetune.loadgen.config import LoadConfig
from servetune.loadgen.priming import primers_for, priming_load
from servetune.loadgen.sessions import load_units
from servetune.loadgen.strategies import arrival_offsets_s
from servetune.records import ErrorClass, TokenCountSource
from servetune.result import TrialResult
from servetune.sla import SLA
from servetune.validity import ValidityRules
from servetune.workload.request import WorkloadRequest

from . import tokens as tk
from .args import SimArgs, server_args_from_flags
from .frontend import FrontEnd
from .requests import Iteration, RequestRejected, SimRequest
from .scheduler import Scheduler
from .telemetry import SimTelemetry

ENDPOINTS = ("chat", "completions", "generate")


def build_prompt(req: WorkloadRequest, endpoint: str, args: SimArgs) -> tk.Prompt:
    """Token ids for a workload request as the HTTP server would count them for ``endpoint``."""
    if endpoint == "chat":
        return tk.chat_prompt(req.chat_messages(), args.model)
    return tk.text_prompt(req.prompt_text(), req.all_images if endpoint == "generate" else (), args.model)


def simulate(
    args: SimArgs | Mapping[str, Any],
    requests: Sequence[WorkloadRequest],
    load: LoadConfig,
    *,
    sla: SLA | None = None,
    rules: ValidityRules | None = None,
    seed: int = 0,
    endpoint: str = "chat",
    gpu_interval_ms: float = 100.0,
    scrape_interval_s: float = 1.0,
    cost: Cost | None = None,
) -> TrialResult:
    """Run ``requests`` under ``load`` against the modelled server in virtual time."""
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint must be one of {ENDPOINTS}, got {endpoint!r}")
    if not requests:
        raise ValueError("requests: nothing to simulate")
    if load.warmup_requests >= len(requests):
        raise ValueError(
            f"warmup_requests ({load.warmup_requests}) must be fewer than the requests ({len(requests)})"
        )
    sim_args = server_args_from_flags(args)
    wall0 = time.perf_counter()
    first = primers_for(requests, load)
    run = _Run(sim_args, first + list(requests), load, endpoint, seed, scrape_interval_s, primers=len(first))
    run.execute()
    return run.result(sla, rules, gpu_interval_ms, time.perf_counter() - wall0, cost)


class _Run:
    """One virtual-time trial: the client side (loop semantics) around a Scheduler."""

    def __init__(
        self,
        args: SimArgs,
        requests: list[WorkloadRequest],
        load: LoadConfig,
        endpoint: str,
        seed: int,
        scrape_interval_s: float,
        primers: int = 0,
    ):
        """``primers``: how many of ``requests`` (the first ones) prime the cache before the trial."""
        self.args = args
        self.requests = requests
        self.load = load
        self.primers = primers
        self.t_start = 0.0  # when the trial's own load starts (after the primers)
        self.endpoint = endpoint
        self.seed = seed
        self.sched = Scheduler(args)
        self.fe = FrontEnd.from_args(args)
        self.entering: list[tuple[float, int, SimRequest]] = []  # (leaves the front end, rid, request)
        self.tel = SimTelemetry(args, self.sched, scrape_interval_s)
        n_warm = primers + load.warmup_requests
        self.records = [r.new_record(i < n_warm) for i, r in enumerate(requests)]
        self.sent_at: dict[int, float] = {}
        self.unsent: set[int] = set()  # a session's turns after a failed one
        self.drain_end = 0.0
        self.iterations: list[Iteration] = []

    # the client: pending sends as a heap of (due time, order, request index, scheduled time, a session's
    # next turn); the load's units are requests or sessions (servetune.loadgen.sessions), as the loadgen's
    def execute(self) -> None:
        c = self.load.concurrency
        units = load_units(self.requests)  # warm-up first, in the same load (as the loadgen)
        t = 0.0
        if self.primers:  # one request each, before the trial: its telemetry starts after them
            t = self._phase(units[:self.primers], t, closed=True,
                            conc=priming_load(self.load, self.primers).concurrency)
            units = units[self.primers:]
            self.tel.restart(t)
        self.t_start = t
        if self.load.mode == "rate":
            load = self.load if self.load.seed or not self.seed else self.load.model_copy(update={"seed": self.seed})
            offsets = arrival_offsets_s(load, len(units), [self.requests[u[0]] for u in units])
            t = self._phase(units, t, closed=False, conc=c, offsets=offsets)
        else:  # a closed loop, or waves of c (static batching: the next c once the last c are all done)
            t = self._phase(units, t, closed=True, conc=c, waves=self.load.mode == "waves")
        self.drain_end = t

    def _phase(
        self, units: list[list[int]], t0: float, *, closed: bool, conc: int, offsets: list[float] | None = None,
        waves: bool = False,
    ) -> float:
        sched, tel = self.sched, self.tel
        pending: list[tuple[float, int, int, float, bool]] = []
        seq = 0
        in_flight = 0  # units (requests or sessions) under way
        nxt = 0  # next unit not yet scheduled
        backlog: list[tuple[float, int]] = []  # open loop: due but over the cap (scheduled time, index)
        follow = {u[k]: u[k + 1] for u in units for k in range(len(u) - 1)}  # a session's next turn
        answers: dict[int, list[str]] = {}  # a session's answers so far, by its first turn's index
        first_of = {i: u[0] for u in units for i in u}
        if closed:
            for _ in range(min(conc, len(units))):
                heapq.heappush(pending, (t0, seq, units[nxt][0], t0, False))
                seq += 1
                nxt += 1
        else:
            assert offsets is not None
            for pos, u in enumerate(units):
                due = t0 + offsets[pos]
                heapq.heappush(pending, (due, seq, u[0], due, False))
                seq += 1
            nxt = len(units)
        remaining = sum(len(u) for u in units)
        t = t0
        current: Iteration | None = None

        def complete(i: int, at: float) -> None:
            nonlocal in_flight, remaining, seq, nxt
            remaining -= 1
            j = follow.get(i)
            if j is not None and self.records[i].error_class is None:  # the user reads, thinks, answers
                answers.setdefault(first_of[i], []).append(
                    tk.output_text(i, 0, self.records[i].completion_tokens or 0))
                due = at + self.requests[j].think_s
                heapq.heappush(pending, (due, seq, j, due, True))
                seq += 1
                return
            while j is not None:  # a failed turn ends its session: the rest is never sent
                self.unsent.add(j)
                remaining -= 1
                j = follow.get(j)
            in_flight -= 1
            if waves:
                while in_flight == 0 and nxt < len(units) and len(pending) < conc:  # the next wave, whole
                    heapq.heappush(pending, (at, seq, units[nxt][0], at, False))
                    seq += 1
                    nxt += 1
            elif closed and nxt < len(units):
                heapq.heappush(pending, (at, seq, units[nxt][0], at, False))
                seq += 1
                nxt += 1
            elif not closed and backlog:
                sched_t, k = backlog.pop(0)
                in_flight += 1
                if not self._send(k, at, at - sched_t):
                    complete(k, at)

        def send_next() -> None:
            nonlocal in_flight
            _, _, i, sched_t, turn = heapq.heappop(pending)
            if not turn:
                if not closed and in_flight >= conc:
                    backlog.append((sched_t, i))
                    return
                in_flight += 1
            if not self._send(i, t, t - sched_t, answers.get(first_of[i], []) if turn else None):
                complete(i, t)

        inf = float("inf")
        entering = self.entering

        def next_event() -> None:  # a client's send, or a request leaving the front end for the scheduler
            if entering and (not pending or entering[0][0] <= pending[0][0]):
                sched.add(heapq.heappop(entering)[2], t)
            else:
                send_next()

        while remaining > 0:
            next_ev = min(pending[0][0] if pending else inf, entering[0][0] if entering else inf)
            if current is None:
                if next_ev <= t:
                    next_event()
                    continue
                if not sched.idle:
                    current = sched.next_iteration(t)
                    if current is not None:
                        self._track(current)
                        continue
                if next_ev == inf:
                    break  # nothing can run and nothing will arrive
                t = next_ev
                tel.advance(t)
                next_event()
            elif next_ev < current.end:
                t = next_ev
                tel.advance(t)
                next_event()
            else:
                t = current.end
                tel.advance(t)
                finished = current.finished
                current = None
                for r in finished:
                    self._finished(r)
                    complete(r.rid, t)
        return t

    def _track(self, it: Iteration) -> None:
        self.iterations.append(it)
        self.tel.on_iteration(it)

    def _send(self, i: int, t: float, queue_s: float, answers: list[str] | None = None) -> bool:
        """Hand request i to the server at t (a session's turn with its ``answers`` so far in the history);
        False when the server refused it."""
        rec = self.records[i]
        rec.t_send_s = t
        rec.queue_ms = max(queue_s, 0.0) * 1000.0
        req = self.requests[i] if answers is None else self.requests[i].with_answers(answers)
        try:
            prompt = build_prompt(req, self.endpoint, self.args)
            sreq = SimRequest(rid=i, tokens=prompt.ids, max_new=req.output_tokens, images=prompt.images)
            self.sched.validate(sreq)
            ready = self.fe.ready_at(t, len(prompt.ids), prompt.pixels)
            if ready > t:  # in the front end until then (servetune.sim.frontend)
                heapq.heappush(self.entering, (ready, i, sreq))
            else:
                self.sched.add(sreq, t)
        except (RequestRejected, ValueError) as exc:
            rec.http_status = 400
            rec.error_class = ErrorClass.HTTP_4XX.value
            rec.error_message = f"HTTP 400: {exc}"[:300]
            rec.e2e_ms = 0.0
            return False
        self.sent_at[i] = t
        self.tel.on_request_sent(sreq)
        return True

    def _finished(self, r: SimRequest) -> None:
        rec = self.records[r.rid]
        t_send = self.sent_at[r.rid]
        rec.http_status = 200
        rec.ttft_ms = (r.token_times[0] - t_send) * 1000.0
        rec.e2e_ms = (r.finished_at - t_send) * 1000.0  # type: ignore[operator]
        rec.chunk_offsets_ms = ((np.asarray(r.token_times) - t_send) * 1000.0).tolist()
        rec.chunk_tokens = [1] * len(r.token_times)
        rec.token_count_source = (
            TokenCountSource.META_INFO.value if self.endpoint == "generate" else TokenCountSource.APPORTIONED.value
        )
        rec.prompt_tokens = r.prompt_len
        rec.completion_tokens = r.output_len
        if self.endpoint == "generate" or self.args.enable_cache_report:
            rec.cached_tokens = r.cached_tokens or 0
        self.tel.on_request_finished(r, t_send, streaming=True)

    def result(self, sla: SLA | None, rules: ValidityRules | None, gpu_interval_ms: float,
               wall_s: float, cost: Cost | None = None) -> TrialResult:
        from servetune.metrics import summarize

        args, load = self.args, self.load
        gpu = self.tel.gpu_curve(self.iterations, self.drain_end, gpu_interval_ms, start=self.t_start)
        server = self.tel.server_telemetry(self.drain_end)
        load_d = load.model_dump(mode="json")
        load_d.update(requests=len(self.requests) - self.primers - load.warmup_requests, seed_sim=self.seed,
                      primers=self.primers)
        records = [r for i, r in enumerate(self.records) if i >= self.primers and i not in self.unsent]
        summary = summarize(
            records,
            load=load_d,
            rules=rules,
            sla=sla,
            gpu=gpu,
            server=server,
            lengths_exact=True,
            cost=cost,
        )
        return TrialResult(
            target={
                "engine": "sim",
                "url": None,
                "endpoint": self.endpoint,
                "model": args.served_model_name,
                "model_profile": args.model_profile,
                "gpu_profile": args.gpu_profile,
                "clock": "virtual",
            },
            server_config=args.server_args(),
            load=load_d,
            sla=sla.model_dump(mode="json") if sla is not None else {},
            t0_unix=datetime.now(UTC).timestamp(),
            records=records,
            gpu=gpu,
            server=server,
            environment={
                "engine": "sim",
                "simulated": True,
                "sglang_version_modelled": "0.5.23",
                "virtual_duration_s": self.drain_end,
                "wall_s": wall_s,
                "speedup": self.drain_end / wall_s if wall_s > 0 else None,
            },
            summary=summary,
        )
