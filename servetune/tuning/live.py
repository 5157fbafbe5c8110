"""LiveTrialRunner: trials against real servers, started through the plan's engine and runner.

One server at a time: a trial whose flags differ from the running server's stops it and starts
a new one (every server-side change is a restart, as the protocol requires). Each level is one
``servetune.trial.run_trial`` with the clean-environment preflight, so a campaign's trials are
measured exactly like ``servetune bench``. GPU time charged = wall time, start-up included.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from servetune.plan import TuningPlan
from servetune.tuning.runner import RunReport, failed_result
from servetune.tuning.state import Flags, TrialSpec

log = logging.getLogger(__name__)

# flags -> a context manager that starts the server and yields an object with ``.url``
Provisioner = Callable[[Flags], contextlib.AbstractContextManager[Any]]


def engine_provisioner(plan: TuningPlan) -> Provisioner:
    """Start servers with servetune.engines / servetune.runners (the plan's engine and runner sections)."""
    from servetune.engines import EngineConfig
    from servetune.runners import RunnerConfig, provision

    runner_cfg = RunnerConfig.model_validate({"kind": plan.runner.kind, **plan.runner.options})

    def start(flags: Flags) -> contextlib.AbstractContextManager[Any]:
        engine = EngineConfig.model_validate({
            "kind": plan.engine.kind, "model": plan.model, "flags": dict(flags),
            **({"port": plan.engine.port} if plan.engine.port is not None else {}),
            "ready_timeout_s": plan.engine.ready_timeout_s,
        })
        return provision(engine, runner_cfg)

    return start


def default_preflight() -> Callable[[], None] | None:
    """The runners' clean-environment check (no foreign GPU process), when that module is there."""
    try:
        from servetune.runners import preflight
    except ImportError:
        return None
    check = getattr(preflight, "check_clean_environment", None) or getattr(preflight, "check", None)
    return check if callable(check) else None


class LiveTrialRunner:
    """Real trials; restarts the server whenever the flags change; always stops what it started."""

    def __init__(self, plan: TuningPlan, *, provisioner: Provisioner | None = None,
                 preflight: Callable[[], None] | None = None, url: str | None = None) -> None:
        self.plan = plan
        self.url = url or (plan.engine.url if plan.engine.kind == "external" else None)
        self._provisioner = provisioner
        self._preflight = preflight
        self._stack: contextlib.ExitStack | None = None
        self._server: Any = None
        self._flags: Flags | None = None

    def _ensure_server(self, flags: Flags) -> bool:
        """The server for ``flags``, (re)started if needed; True when it (re)started."""
        if self.url is not None:  # an endpoint we do not launch
            return False
        if self._server is not None and flags == self._flags:
            return False
        self._stop()
        if self._provisioner is None:
            self._provisioner = engine_provisioner(self.plan)
        stack = contextlib.ExitStack()
        try:
            self._server = stack.enter_context(self._provisioner(flags))
        except BaseException:
            stack.close()
            raise
        self._stack, self._flags = stack, dict(flags)
        return True

    def _stop(self) -> None:
        stack, self._stack, self._server, self._flags = self._stack, None, None, None
        if stack is not None:
            stack.close()

    def run(self, spec: TrialSpec, *, experiment_id: str) -> RunReport:
        from servetune.loadgen import LoadConfig, Target
        from servetune.trial import TrialRequest, run_trial

        t0 = time.monotonic()
        try:
            restarted = self._ensure_server(spec.flags)
        except Exception as exc:  # noqa: BLE001 - a config the engine refuses is a failed trial, not a crash
            log.warning("server with %s failed to start: %s", spec.flags, exc)
            self._stop()
            result = failed_result(spec, f"server failed to start: {type(exc).__name__}: {exc}",
                                   experiment_id=experiment_id)
            return RunReport(result=result, gpu_seconds=time.monotonic() - t0, restarted=True)
        url = self.url or self._server.url
        target = Target(url=url, endpoint=self.plan.endpoint, model=self.plan.model)
        req = TrialRequest(
            target=target,
            load=LoadConfig(mode="concurrency", concurrency=spec.concurrency, warmup_requests=spec.warmup,
                            seed=self.plan.seed),
            workload=self.plan.workload,
            num_requests=spec.requests,
            sla=self.plan.sla,
            stage=spec.stage,
            server_config=dict(spec.flags),
            experiment_id=experiment_id,
            model_path=self.plan.model,
        )
        preflight = self._preflight if self._preflight is not None else default_preflight()
        try:
            result = run_trial(req, preflight=preflight if restarted or spec.stage == "correctness" else None)
        except Exception as exc:  # noqa: BLE001 - unreachable / bad input before any request: recorded
            result = failed_result(spec, f"{type(exc).__name__}: {exc}", experiment_id=experiment_id,
                                   target=target.model_dump(mode="json"))
        return RunReport(result=result, gpu_seconds=time.monotonic() - t0, restarted=restarted)

    def close(self) -> None:
        self._stop()
