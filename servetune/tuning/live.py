"""LiveTrialRunner: trials against real servers, started through the plan's engine and runner.

One server at a time: a trial whose flags differ from the running server's stops it and starts
a new one (every server-side change is a restart, as the protocol requires). Each level is one
``servetune.trial.run_trial`` with the clean-environment preflight, so a campaign's trials are
measured exactly like ``servetune bench``. GPU time charged = wall time, start-up included.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servetune.plan import TuningPlan
from servetune.redact import redact
from servetune.telemetry import startup_log
from servetune.tuning.runner import RunReport, failed_result, trial_load
from servetune.tuning.state import ENGINE_CRASH, Flags, TrialSpec

log = logging.getLogger(__name__)

DEATH_WAIT_S = 2.0  # how long a failed trial's engine may take to be seen dead
WARMUP_SEED = 7919  # the post-start warm-up's seed offset: its requests are none of the measured ones
#: where the engine's own key waits for the client (children inherit it; only this name is ever recorded)
ENGINE_KEY_ENV = "SERVETUNE_ENGINE_API_KEY"

# flags -> a context manager that starts the server and yields a servetune.runners.RunningServer
Provisioner = Callable[[Flags], contextlib.AbstractContextManager[Any]]


def engine_provisioner(plan: TuningPlan, *, log_dir: Path | None = None, owner: str | None = None) -> Provisioner:
    """Start servers with servetune.runners.provision: the plan's engine with the trial's flags, on its runner
    (which refuses a dirty environment before launch when the runner's ``check_clean`` is on)."""
    from servetune.engines.knobs import with_flags
    from servetune.runners import provision

    def start(flags: Flags) -> contextlib.AbstractContextManager[Any]:
        engine = with_flags(plan.engine, flags)
        if owner:  # servetune.runners.sweep finds it by this tag, whatever happens to us
            from servetune.runners.sweep import OWNER_ENV

            engine = engine.model_copy(update={"env": {**engine.env, OWNER_ENV: owner}})
        return provision(engine, plan.runner, log_dir=log_dir)

    return start


def engine_api_key(engine: Any) -> str | None:
    """The key the plan's engine is launched with (``--api-key`` among its flags, or the environment variable the
    engine reads it from: ``EngineBase.tuning.api_key_env``), which every request must then carry; None when it
    takes none."""
    from servetune.redact import split_secret_flags

    if not getattr(engine, "launches", False):
        return None
    _argv, secrets = split_secret_flags(engine.launch_argv(host="127.0.0.1", port=1))
    env_name = type(engine).tuning.api_key_env
    return secrets.get("api-key") or ((getattr(engine, "env", None) or {}).get(env_name) if env_name else None) or None


def running_preflight(server: Any) -> Callable[[], None] | None:
    """While our server runs: nothing foreign may hold its GPUs (servetune.runners.preflight)."""
    handle = getattr(server, "handle", None)
    if handle is None or not hasattr(handle, "preflight_running"):
        return None

    def check() -> None:
        handle.preflight_running().raise_if_dirty()

    return check


def _server_pids(server: Any) -> list[int] | None:
    """The engine's own processes (leader and workers), so the clean-GPU check does not count them."""
    pid = getattr(server, "pid", None)
    if getattr(server, "host", "127.0.0.1") not in ("127.0.0.1", "localhost", "::1") or not pid:
        return None  # a remote engine: its GPU is checked on its host by the runner
    import psutil

    try:
        return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return [pid]


def _local_log(server: Any) -> str | None:
    """The engine's log file when it is written on this machine (the scheduler's batch lines are read from it)."""
    path = getattr(server, "log_path", None)
    if path is None or getattr(server, "host", "127.0.0.1") not in ("127.0.0.1", "localhost", "::1"):
        return None
    return str(path) if Path(path).is_file() else None


class LiveTrialRunner:
    """Real trials; restarts the server whenever the flags change; always stops what it started.

    Real engines are noisy: three repeats per decisive trial unless the plan says otherwise."""

    default_repeats = 3

    def __init__(self, plan: TuningPlan, *, provisioner: Provisioner | None = None,
                 preflight: Callable[[], None] | None = None, log_dir: Path | None = None,
                 owner: str | None = None) -> None:
        self.plan = plan
        self.url = plan.engine.url if plan.engine.kind == "external" else None  # type: ignore[union-attr]
        self._provisioner = provisioner or engine_provisioner(plan, log_dir=log_dir, owner=owner)
        self._preflight = preflight
        self._stack: contextlib.ExitStack | None = None
        self._server: Any = None
        self._flags: Flags | None = None
        self._warmed = False  # this server has had its warm-up (budget.warmup_after_start)

    def _ensure_server(self, flags: Flags) -> bool:
        """The server for ``flags``, (re)started if needed; True when it (re)started."""
        if self.url is not None:  # an endpoint we do not launch
            return False
        if self._server is not None and flags == self._flags:
            return False
        self._stop()
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
        from servetune.engines.knobs import with_flags
        from servetune.loadgen import Target
        from servetune.trial import TrialRequest, run_trial
        from servetune.tuning.runner import trial_workload

        t0 = time.monotonic()
        crashed_before = self._dead()
        if crashed_before:  # found dead between trials: a fault, the server is started again
            log.warning("the engine died between trials (%s); starting it again", crashed_before)
            self._stop()
        try:
            restarted = self._ensure_server(spec.flags)
        except Exception as exc:  # noqa: BLE001 - a config the engine refuses is a failed trial, not a crash
            log.warning("server with %s failed to start: %s", redact(spec.flags), exc)
            self._stop()
            result = failed_result(spec, f"server failed to start: {type(exc).__name__}: {exc}",
                                   experiment_id=experiment_id)
            spent = time.monotonic() - t0
            return RunReport(result=result, gpu_seconds=spent, restarted=True, startup_s=spent)
        url = self.url or self._server.url
        model = getattr(self._server, "model", None) or getattr(self.plan.engine, "model", None) or self.plan.model
        target = Target(url=url, endpoint=self.plan.endpoint, model=model)
        key = engine_api_key(with_flags(self.plan.engine, spec.flags)) if self.url is None else None
        if key:  # the engine we launched wants a key: the client sends it, read from the environment at run time
            os.environ[ENGINE_KEY_ENV] = key
            target = target.model_copy(update={"api_key_env": ENGINE_KEY_ENV})
        req = TrialRequest(
            target=target,
            load=trial_load(self.plan, spec),
            workload=trial_workload(self.plan, spec),
            validity=self.plan.validation.rules(),
            num_requests=spec.requests,
            sla=self.plan.sla,
            cost=self.plan.cost,
            stage=spec.stage,
            server_config=dict(spec.flags),
            experiment_id=experiment_id,
            model_path=self.plan.model,
            prompt_template=self.plan.prompt_template,
            gpu_indices=getattr(self.plan.runner, "gpus", None),
            server_pids=_server_pids(self._server),
            server_log=_local_log(self._server),
        )
        preflight = self._preflight if self._preflight is not None else running_preflight(self._server)
        if restarted:
            self._warmed = False
        warm_now = not self._warmed and spec.stage != "correctness" and bool(self.plan.budget.warmup_after_start)
        if warm_now:
            self._warm_up(req, self.plan.budget.warmup_after_start or 0)  # before this server's first measured
            self._warmed = True                                           # trial (the correctness check is none)
        startup = time.monotonic() - t0 if restarted or warm_now else 0.0
        try:
            result = run_trial(req, preflight=preflight)
        except Exception as exc:  # noqa: BLE001 - unreachable / bad input before any request: recorded
            result = failed_result(spec, f"{type(exc).__name__}: {exc}", experiment_id=experiment_id,
                                   target=target.model_dump(mode="json"))
        if restarted and (phases := startup_log.read(req.server_log)):
            result.server = {**(result.server or {}), "startup": phases}  # where this start went, by the engine
        if result.status == "failed" and (died := self._dead(wait_s=DEATH_WAIT_S)):
            # the engine died under this trial: a fault (the decisions re-run it), never a capacity verdict
            result.failure_reason = f"{ENGINE_CRASH}: {died} (the trial: {result.failure_reason})"
            self._stop()
        return RunReport(result=result, gpu_seconds=time.monotonic() - t0, restarted=restarted, startup_s=startup)

    @staticmethod
    def _warm_up(req: Any, requests: int) -> None:
        """``requests`` at the trial's load on another seed, unmeasured and unjudged, right after a start: the
        engine's JIT compiles (kernels for new shapes, the vision tower's first images) land here instead of
        in the first measured window (on an H100 a VLM's first trial after a start was INVALID by them)."""
        from servetune.trial import run_trial

        load = req.load.model_copy(update={"seed": req.load.seed + WARMUP_SEED, "warmup_requests": 0})
        workload = req.workload.model_copy(update={"seed": req.workload.seed + WARMUP_SEED})
        warm = req.model_copy(update={"load": load, "workload": workload, "num_requests": requests, "stage": "warmup",
                                      "server_log": None, "validity": type(req.validity)(min_window_s=0,
                                                                                         min_completions=1)})
        t = time.monotonic()
        try:
            out = run_trial(warm)
            log.info("warm-up after the start: %d requests in %.0f s (%s)", requests, time.monotonic() - t,
                     out.summary.requests_ok)
        except Exception as exc:  # noqa: BLE001 - a warm-up that breaks is the first trial's business
            log.warning("warm-up after the start failed: %s", exc)

    def _dead(self, wait_s: float = 0.0) -> str | None:
        """Why the engine we started is gone (its exit and log tail), or None while it lives.

        ``wait_s``: after a failed trial the engine may be dying still (its sockets close before the
        process is reaped), so look again for that long before calling it alive."""
        if self._server is None or self.url is not None:
            return None
        from servetune.engines.failures import EngineFailure

        deadline = time.monotonic() + wait_s
        while True:
            try:
                self._server.check_alive()
            except EngineFailure as exc:
                tail = " | ".join(line.strip() for line in exc.log_tail[-5:] if line.strip())
                return f"{exc}" + (f"; log tail: {tail}" if tail else "")
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)

    def close(self) -> None:
        self._stop()
