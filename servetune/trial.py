"""run_trial: the one place that glues workload, load generator, telemetry and metrics together.

Used by ``servetune bench``, the tuning runner and the Airflow tasks, so every trial is measured
the same way. Order matters and is fixed here: validate -> build requests -> clean-environment
preflight -> server info -> flush the prefix cache (before warm-up, never after: SGLang PR #37359)
-> telemetry on -> load -> telemetry off -> summary -> fingerprint. Bad input or an unreachable
target raise before any request is sent; a failure once load has started is recorded on the
result (status "failed" + reason), never raised, so nothing measured is lost. With an ``Interrupt``
(``servetune bench``), SIGINT/SIGTERM stop the load the same way: the finished requests are kept and
the trial is returned failed, its reason saying it was interrupted.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, model_validator

from servetune.energy import Cost
from servetune.limits import MAX_SMALL_BYTES, ResponseTooLarge, read_body
from servetune.loadgen import LoadConfig, Target, TargetUnreachable, run_load
from servetune.loadgen.client import LoadOutcome
from servetune.loadgen.priming import primers_for, priming_load
from servetune.loadgen.transport import check_reachable
from servetune.loadgen.workers import run_load_workers, worker_count
from servetune.metrics import summarize
from servetune.result import TrialResult
from servetune.sla import SLA
from servetune.telemetry.environment import fingerprint
from servetune.telemetry.nvml import GpuSampler
from servetune.telemetry.prometheus import MetricsScraper
from servetune.telemetry.scheduler_log import LogTail, capture as scheduler_capture
from servetune.telemetry.server_info import fetch_server_info
from servetune.telemetry.simgpu import SimulatedGpuSampler
from servetune.validity import ValidityRules
from servetune.workload import build_requests, load_tokenizer
from servetune.workload.spec import WorkloadSpec

log = logging.getLogger(__name__)

Progress = Callable[[int, int, int], None]  # (requests done, errors, output tokens), as in run_load
FLUSH_TIMEOUT_S = 30.0


class TrialRequest(BaseModel):
    """Everything one trial needs; checked before anything is sent."""

    model_config = ConfigDict(extra="forbid")

    target: Target
    load: LoadConfig
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    num_requests: int = Field(gt=0, description="measured requests, warm-up (load.warmup_requests) excluded")
    sla: SLA | None = None
    cost: Cost | None = Field(default=None, description="the GPU price: cost per token and per good request")
    gpu_indices: list[int] | None = Field(default=None, description="GPUs to sample (None: all visible)")
    gpu_interval_ms: float = Field(default=100.0, gt=0)
    scrape_interval_s: float = Field(default=1.0, gt=0)
    flush_cache: bool = Field(
        default=True, description="POST /flush_cache before the warm-up, if the server has it"
    )
    stage: str | None = None
    server_config: dict[str, Any] = Field(default_factory=dict)
    experiment_id: str | None = None
    tokenizer: str | None = Field(
        default=None, description="tokenizer.json or model dir; else workload.tokenizer"
    )
    model_path: str | None = Field(default=None, description="for the environment fingerprint")
    prompt_template: str | None = Field(default=None, description="for the environment fingerprint")
    server_pids: list[int] | None = Field(
        default=None, description="PIDs of the server under test: GPU processes outside them are foreign"
    )
    validity: ValidityRules = Field(
        default_factory=ValidityRules, description="what the trial needs to be VALID (servetune.validity)"
    )
    client_workers: int | None = Field(
        default=None, ge=1, description="client processes (servetune.loadgen.workers); None: from the streams and cores"
    )
    server_log: str | None = Field(
        default=None, description="the engine's log file on this machine: its scheduler batch lines are kept"
    )

    @model_validator(mode="after")
    def _paths_exist(self) -> TrialRequest:
        tok = self.tokenizer or self.workload.tokenizer
        if tok is not None and not Path(tok).exists():
            raise ValueError(f"tokenizer: {tok} does not exist")
        if any(i < 0 for i in self.gpu_indices or []):
            raise ValueError(f"gpu_indices: must be >= 0, got {self.gpu_indices}")
        return self

    @property
    def total_requests(self) -> int:
        return self.load.warmup_requests + self.num_requests


class Interrupt:
    """Signals that end a trial early but keep what it measured: the first stops the load (requests in
    flight are cancelled, the rest never sent) and the trial comes back failed with the reason; a
    second cancels the trial outright (the caller sees ``CancelledError``/``KeyboardInterrupt``).
    Installed on the trial's own loop, in the main thread only (elsewhere signals stay as they are)."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> None:
        self.signals = signals
        self.received: int | None = None
        self.event = asyncio.Event()
        self._installed: list[int] = []
        self._task: asyncio.Task | None = None

    @property
    def name(self) -> str | None:
        return signal.Signals(self.received).name if self.received is not None else None

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        for sig in self.signals:
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
            except (ValueError, RuntimeError, NotImplementedError):  # not the main thread
                continue
            self._installed.append(sig)

    def remove(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in self._installed:
            loop.remove_signal_handler(sig)
        self._installed.clear()

    def _on_signal(self, sig: int) -> None:
        if self.received is None:
            self.received = sig
            self.event.set()
            log.warning("%s: stopping the load; the requests finished so far are kept",
                        signal.Signals(sig).name)
        elif self._task is not None:
            self._task.cancel()

    def reason(self, total: int, outcome: LoadOutcome | None = None) -> str:
        """The failure reason of an interrupted trial: how far it got."""
        if outcome is None:
            return f"interrupted by {self.name} before the load started: none of {total} requests was sent"
        cancelled = sum(r.error_class == "cancelled" for r in outcome.records)
        done = len(outcome.records) - cancelled
        return (f"interrupted by {self.name}: a partial result, {done} of {total} requests finished "
                f"({cancelled} in flight were cancelled, {total - len(outcome.records)} never sent)")


def run_trial(
    req: TrialRequest,
    *,
    preflight: Callable[[], None] | None = None,
    progress: Progress | None = None,
    interrupt: Interrupt | None = None,
) -> TrialResult:
    """Run one trial on a fresh event loop (uvloop when installed); see ``run_trial_async``."""
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(run_trial_async(req, preflight=preflight, progress=progress, interrupt=interrupt))


async def run_trial_async(
    req: TrialRequest,
    *,
    preflight: Callable[[], None] | None = None,
    progress: Progress | None = None,
    interrupt: Interrupt | None = None,
) -> TrialResult:
    """Run one trial. Raises ``ValueError``/``TargetUnreachable`` before any request; else returns."""
    if interrupt is None:
        return await _run_trial(req, preflight, progress, None)
    interrupt.install()
    try:
        return await _run_trial(req, preflight, progress, interrupt)
    finally:
        interrupt.remove()


async def _run_trial(
    req: TrialRequest,
    preflight: Callable[[], None] | None,
    progress: Progress | None,
    interrupt: Interrupt | None,
) -> TrialResult:
    sampling = {"ignore_eos": req.workload.ignore_eos, "temperature": req.workload.temperature}
    req = req.model_copy(update={"target": req.target.model_copy(update=sampling)})  # the workload decides
    tok_path = req.tokenizer or req.workload.tokenizer
    tokenizer = load_tokenizer(tok_path) if tok_path else None
    batch = build_requests(req.workload, req.total_requests, tokenizer=tokenizer)
    first = primers_for(batch.requests, req.load)
    await check_reachable(req.target)

    result = TrialResult(
        stage=req.stage,
        experiment_id=req.experiment_id,
        target=req.target.model_dump(mode="json"),
        server_config=dict(req.server_config),
        load=req.load.model_dump(mode="json") | {"requests": req.num_requests, "primers": len(first)},
        sla=req.sla.model_dump(mode="json", exclude_none=True) if req.sla else {},
        workload=batch.describe(),
    )

    if preflight is not None:
        try:
            preflight()
        except Exception as exc:  # noqa: BLE001 - the environment check's verdict, recorded
            return _failed(result, f"preflight failed: {exc}", req, batch.lengths_exact)

    server: dict[str, Any] = {"server_info": await fetch_server_info(req.target.url, req.target.api_key())}
    if req.flush_cache:
        server["flush_cache"] = flushed = await _flush_cache(req.target)
        if flushed["status"] is None:  # no answer at all: if it died on the flush, say so
            try:
                await check_reachable(req.target)
            except TargetUnreachable:
                raise TargetUnreachable(f"target {req.target.url} went away during the prefix-cache flush"
                                        f" ({flushed['body']}); no request was sent") from None
    if interrupt is not None and interrupt.received is not None:
        return _failed(result, interrupt.reason(req.total_requests), req, batch.lengths_exact)

    if first:
        result.load["primer_errors"] = await _prime(req, first)
    log_tail = LogTail(req.server_log)  # the lines the engine logs from here on belong to this trial
    t0_ns = time.perf_counter_ns()
    result.t0_unix = time.time()
    gpu_sampler = _gpu_sampler(req, server["server_info"])
    scraper = _scraper(req)
    gpu_sampler.start(t0_ns)
    outcome = None
    workers = worker_count(req.load.concurrency, req.client_workers)
    target = req.target
    if (images := req.workload.images) is not None and images.transport == "http":
        target = target.model_copy(update={"images_over_http": True, "image_host": images.host})
    try:
        await scraper.start(t0_ns)
        stop = interrupt.event if interrupt is not None else None
        if workers > 1:  # one event loop per share of the streams (no per-request progress)
            outcome = await run_load_workers(target, batch.requests, req.load, t0_ns=t0_ns, workers=workers,
                                             tokenizer=tokenizer, stop=stop)
        else:
            outcome = await run_load(target, batch.requests, req.load, t0_ns=t0_ns, progress=progress,
                                     tokenizer=tokenizer, stop=stop)
    except Exception as exc:  # noqa: BLE001 - recorded on the result, telemetry kept
        result.status, result.failure_reason = "failed", f"load failed: {type(exc).__name__}: {exc}"
        log.exception("trial load failed")
    finally:
        server.update(await _stop_scraper(scraper))
        result.gpu = gpu_sampler.stop()
    if (batches := scheduler_capture(log_tail, result.t0_unix, time.time())) is not None:
        server["scheduler_log"] = batches
    result.server = server

    if outcome is not None:
        result.records = outcome.records
        result.load |= {
            "window_start_s": outcome.window_start_s,
            "window_end_s": outcome.window_end_s,
            "drain_end_s": outcome.drain_end_s,
            "client_lag_p99_ms": outcome.client_lag_p99_ms,
            "client_lag_max_ms": outcome.client_lag_max_ms,
            "client_workers": workers,
            "http_client": outcome.http_client,
            "arrival_stamps": outcome.arrival_stamps,
        }
    result.summary = summarize(
        result.records,
        load=result.load,
        rules=req.validity,
        sla=req.sla,
        gpu=result.gpu,
        server=server,
        lengths_exact=batch.lengths_exact,
        cost=req.cost,
    )
    result.environment = _environment(req, server, result.gpu)

    if outcome is not None and outcome.stopped and interrupt is not None:
        result.status, result.failure_reason = "failed", interrupt.reason(req.total_requests, outcome)
    elif result.status == "ok":
        reason = await _failure_after_load(req.target, result)
        if reason:
            result.status, result.failure_reason = "failed", reason
    return result


async def _prime(req: TrialRequest, first: list[Any]) -> int:
    """Send the primers (servetune/loadgen/priming.py) before the trial's clock starts; how many failed
    (a primer that fails leaves its part cold, and the trial's own requests meet the same error)."""
    out = await run_load(req.target, first, priming_load(req.load, len(first)), t0_ns=time.perf_counter_ns())
    failed = sum(1 for r in out.records if not r.ok)
    if failed:
        log.warning("%d of %d cache primers failed", failed, len(first))
    return failed


def _failed(result: TrialResult, reason: str, req: TrialRequest, lengths_exact: bool) -> TrialResult:
    result.status, result.failure_reason = "failed", reason
    result.summary = summarize(
        [], load=result.load, rules=req.validity, sla=req.sla, gpu=None, server=None, lengths_exact=lengths_exact
    )
    return result


async def _failure_after_load(target: Target, result: TrialResult) -> str | None:
    """A trial whose every measured request failed, or whose target stopped answering, failed."""
    s = result.summary
    classes = ", ".join(f"{k}: {v}" for k, v in sorted(s.errors_by_class.items()))
    try:
        await check_reachable(target)
    except TargetUnreachable as exc:  # its own text says "no request was sent", true only before the load
        return (f"the target {target.url} stopped answering during the trial ({exc.cause}): {s.requests_ok} of"
                f" {s.requests_measured} measured requests finished, {s.requests_failed} failed"
                + (f" ({classes})" if classes else "") + "; every request is in the result")
    if s.requests_measured and s.requests_ok == 0:
        sample = next((r.error_message for r in result.records if not r.warmup and r.error_message), None)
        return f"every measured request failed ({classes})" + (f"; e.g. {sample}" if sample else "")
    return None


async def _flush_cache(target: Target) -> dict[str, Any]:
    """POST /flush_cache so the warm-up, not a previous trial, fills the prefix cache."""
    url = target.url + "/flush_cache"
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                url, headers=_auth(target), timeout=aiohttp.ClientTimeout(total=FLUSH_TIMEOUT_S)
            ) as resp,
        ):
            text = (await read_body(resp, MAX_SMALL_BYTES, f"POST {url}")).decode("utf-8", "replace")[:200]
            status = {"status": resp.status, "flushed": resp.status < 300, "body": text}
    except (aiohttp.ClientError, TimeoutError, OSError, ResponseTooLarge) as exc:
        status = {"status": None, "flushed": False, "body": f"{type(exc).__name__}: {exc}"}
    if resp_missing := status["status"] in (404, 405):
        log.info("%s has no /flush_cache; the prefix cache was not flushed", target.url)
    elif not status["flushed"]:
        log.warning("flushing the prefix cache failed: %s", status)
    status["supported"] = not resp_missing
    return status


def _gpu_sampler(req: TrialRequest, server_info: dict[str, Any]) -> GpuSampler | SimulatedGpuSampler:
    """NVML for a real engine; a simulated engine's modelled GPUs for the sim (marked ``simulated``)."""
    if server_info.get("simulated"):
        return SimulatedGpuSampler(req.target.url, req.gpu_interval_ms / 1000.0, headers=_auth(req.target))
    return GpuSampler(req.gpu_interval_ms / 1000.0, req.gpu_indices, own_pids=req.server_pids)


def _auth(target: Target) -> dict[str, str]:
    key = target.api_key()
    return {"Authorization": f"Bearer {key}"} if key else {}


def _scraper(req: TrialRequest) -> MetricsScraper:
    return MetricsScraper(req.target.url, interval_s=req.scrape_interval_s, headers=_auth(req.target))


async def _stop_scraper(scraper: MetricsScraper) -> dict[str, Any]:
    try:
        return dict(await scraper.stop() or {})
    except Exception as exc:  # noqa: BLE001 - missing server telemetry is stated, not fatal
        log.warning("metrics scraper: %s", exc)
        return {"scrape_error": f"{type(exc).__name__}: {exc}"}


def _environment(req: TrialRequest, server: dict[str, Any], gpu: dict[str, Any]) -> dict[str, Any]:
    return fingerprint(
        server_info=server.get("server_info"),
        gpu=gpu,
        model_path=req.model_path,
        prompt_template=req.prompt_template,
    )
