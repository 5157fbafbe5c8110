"""Running one trial: the interface the campaign drives, and its simulated implementation.

The decisions never run anything; a ``TrialRunner`` turns a ``TrialSpec`` into a ``TrialResult``
and says how much GPU time it cost (the trial plus any server restart its flags required).
``SimTrialRunner`` answers in the simulator's virtual time (seconds per campaign, for dry runs
and bench/tuning_efficiency.py); ``LiveTrialRunner`` (servetune.tuning.live) starts real servers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from servetune.engines.knobs import sim_flags
from servetune.plan import TuningPlan
from servetune.plan.protocols import MeasurementProtocol, protocol_workload
from servetune.result import TrialResult
from servetune.tuning.state import TrialSpec


@dataclass
class RunReport:
    result: TrialResult
    gpu_seconds: float  # trial time plus the (re)start it needed
    restarted: bool
    startup_s: float = 0.0  # of gpu_seconds: the (re)start and its unmeasured warm-up


class TrialRunner(Protocol):
    """Runs trials one at a time; restarts the server when a trial's flags differ from the running ones."""

    #: repeats per decisive trial when the plan leaves ``repeats.count`` unset
    default_repeats: int

    def run(self, spec: TrialSpec, *, experiment_id: str) -> RunReport: ...

    def close(self) -> None: ...


def protocol_of(plan: TuningPlan, spec: TrialSpec) -> MeasurementProtocol | None:
    """The plan's protocol a trial measures, None for a campaign trial."""
    if spec.protocol is None:
        return None
    found = next((p for p in plan.protocols if p.name == spec.protocol), None)
    if found is None:
        raise ValueError(f"the plan has no protocol {spec.protocol!r}")
    return found


def trial_workload(plan: TuningPlan, spec: TrialSpec) -> Any:
    """The plan's workload (a protocol's, for its trial) with the repeat's seed: repeat k sees new requests."""
    protocol = protocol_of(plan, spec)
    workload = plan.workload if protocol is None else protocol_workload(plan.workload, protocol)
    if not spec.seed_offset:
        return workload
    return workload.model_copy(update={"seed": workload.seed + spec.seed_offset})


def trial_load(plan: TuningPlan, spec: TrialSpec) -> Any:
    """The load generator's settings for ``spec``: its streams, or its rate under the plan's arrivals."""
    from servetune.loadgen import LoadConfig

    common = {"concurrency": spec.concurrency, "warmup_requests": spec.warmup, "seed": plan.seed + spec.seed_offset}
    protocol = protocol_of(plan, spec)
    if protocol is not None and protocol.batching == "static":
        return LoadConfig(mode="waves", **common)
    if spec.rate is None:
        return LoadConfig(mode="concurrency", **common)
    if spec.burstiness is not None:  # a robustness trial: gamma bursts, whatever the plan's mode
        arrival, burstiness = "gamma", spec.burstiness
    else:
        assert plan.load is not None, "a trial with a rate needs the plan's load section"
        arrival, burstiness = plan.load.arrival, plan.load.burstiness
    return LoadConfig(mode="rate", rate=spec.rate, arrival=arrival, burstiness=burstiness, exact_rate=True,
                      **common)


def failed_result(spec: TrialSpec, reason: str, *, experiment_id: str,
                  target: dict[str, Any] | None = None) -> TrialResult:
    """A trial that could not run (server refused to start, unreachable): recorded, never dropped."""
    return TrialResult(
        status="failed", failure_reason=reason, stage=spec.stage, experiment_id=experiment_id,
        target=target or {}, server_config=dict(spec.flags),
        load={"mode": "concurrency" if spec.rate is None else "rate", "concurrency": spec.concurrency,
              "rate": spec.rate, "warmup_requests": spec.warmup, "requests": spec.requests},
    )


def virtual_duration_s(result: TrialResult) -> float:
    """From the first send to the last response end: how long the trial held the GPU."""
    ends = [r.t_send_s + (r.e2e_ms or 0.0) / 1000.0 for r in result.records]
    if ends:
        return max(ends) - min(r.t_send_s for r in result.records)
    return result.summary.window_s or 0.0


class SimTrialRunner:
    """Trials answered by ``servetune.sim.simulate`` in virtual time; restarts cost ``budget.restart_cost_s``.

    Deterministic under a seed, so one trial per decision is the default (``default_repeats``)."""

    default_repeats = 1

    def __init__(self, plan: TuningPlan, *, gpu: str | None = None, model: str | None = None,
                 restart_cost_s: float | None = None):
        """``gpu``/``model``: simulator profiles for a plan whose engine is not the sim (dry-run estimates)."""
        self.plan = plan
        self.gpu, self.model = gpu, model
        self.restart_cost_s = plan.budget.restart_cost_s if restart_cost_s is None else restart_cost_s
        self._running: dict[str, Any] | None = None
        self._requests: dict[tuple[int, int, str | None], Any] = {}  # WorkloadBatch by size, seed, protocol

    @classmethod
    def for_plan(cls, plan: TuningPlan) -> SimTrialRunner | None:
        """The plan in virtual time: its own flags for a sim engine, an SGLang plan through its ``estimate``
        profiles; None for anything else (the simulator models SGLang's flags only)."""
        if plan.engine.kind == "sim":
            return cls(plan)
        if plan.estimate is None or plan.engine.kind != "sglang":
            return None
        return cls(plan, gpu=plan.estimate.gpu, model=plan.estimate.model)

    def _batch(self, spec: TrialSpec) -> Any:
        """The trial's workload batch (its requests and the description a trial result keeps)."""
        n = spec.warmup + spec.requests
        key = (n, spec.seed_offset, spec.protocol)
        if key not in self._requests:
            from servetune.workload import build_requests

            workload = trial_workload(self.plan, spec)
            if workload.tokenizer and not Path(workload.tokenizer).exists():
                # a GPU host's tokenizer, absent here: the simulator counts tokens with its own model
                workload = workload.model_copy(update={"tokenizer": None})
            self._requests[key] = build_requests(workload, n)
        return self._requests[key]

    def run(self, spec: TrialSpec, *, experiment_id: str) -> RunReport:
        from servetune.sim.args import server_args_from_flags
        from servetune.sim.virtual import simulate

        restarted = spec.flags != self._running
        restart = self.restart_cost_s if restarted else 0.0
        try:
            args = server_args_from_flags(sim_flags(self.plan.engine, spec.flags, gpu=self.gpu, model=self.model))
        except ValueError as exc:  # SimArgsError: what SGLang would refuse at start-up
            self._running = None
            result = failed_result(spec, f"server failed to start: {exc}", experiment_id=experiment_id)
            return RunReport(result=result, gpu_seconds=restart, restarted=True, startup_s=restart)
        self._running = dict(spec.flags)
        load = trial_load(self.plan, spec)
        batch = self._batch(spec)
        result = simulate(args, batch.requests, load, sla=self.plan.sla, rules=self.plan.validation.rules(),
                          seed=self.plan.seed, endpoint=self.plan.endpoint, cost=self.plan.cost)
        result.stage, result.experiment_id = spec.stage, experiment_id
        result.workload = batch.describe()  # the spec a reader (diagnose, the report) needs, as a live trial's
        result.server_config = dict(spec.flags)
        result.target["model"] = self.plan.model  # one identity, as a live trial of the plan says (the profile stays)
        return RunReport(result=result, gpu_seconds=virtual_duration_s(result) + restart, restarted=restarted,
                         startup_s=restart)

    def close(self) -> None:
        self._running = None
