"""Start an engine, know when it really serves, and always tear it down.

``provision(engine, runner)`` is the context manager a trial uses; ``Server`` is the explicit API
(``start()``, ``wait_ready()``, ``stop()``) for callers that split the steps (Airflow tasks).
Every failure is an ``EngineFailure`` with a classified kind and the last 50 log lines.
Secrets never reach an argv (``secure_launch``) and never leave in a log line, a log tail or a printed
command: the launch's env values and secret flags are masked (``servetune.redact``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from servetune.engines.common import EngineBase
from servetune.engines.failures import EngineFailure, FailureKind, failure_from_log
from servetune.redact import install_log_redaction, known_secrets, redact_argv, redact_text, remember, scrub
from servetune.runners.backend import RunnerBackend
from servetune.runners.base import (
    KubernetesRunnerConfig,
    LocalRunnerConfig,
    RunnerBase,
    RunningServer,
    SSHRunnerConfig,
    TeardownReport,
    tail_file,
)
from servetune.runners.preflight import PreflightReport

log = logging.getLogger(__name__)
TAIL_LINES = 50


def secure_launch(engine: EngineBase, argv: list[str]) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """``(argv, env, files)`` to launch with: secret flags (``--api-key``...) taken off the command line, where
    ``ps`` would show them, as the engine reads them (``EngineBase.secure_launch``): vLLM from its environment
    (``VLLM_API_KEY``), SGLang from a YAML file it loads with ``--config`` (``files``: name -> text, written 0600
    by the runner). The simulator takes neither: its flags stay on argv (redacted wherever shown)."""
    return engine.secure_launch(argv)


def default_log_dir() -> Path:
    return Path(os.environ.get("SERVETUNE_LOG_DIR") or Path.home() / ".cache" / "servetune" / "logs")


def make_backend(runner: RunnerBase) -> RunnerBackend:
    if isinstance(runner, LocalRunnerConfig):
        from servetune.runners.local import LocalBackend

        return LocalBackend(runner)
    if isinstance(runner, SSHRunnerConfig):
        from servetune.runners.ssh import SSHBackend

        return SSHBackend(runner)
    if isinstance(runner, KubernetesRunnerConfig):
        raise TypeError("the kubernetes runner builds a manifest (servetune serve --runner kubernetes --dry-run); "
                        "apply it with kubectl as docs/engines.md shows")
    raise TypeError(f"unknown runner {type(runner).__name__}")


def http_ok(url: str, timeout_s: float) -> bool:
    """GET ``url`` answers 200 (anything else, or no answer, is "not yet")."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (http(s) URLs we built)
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def fetch_resolved_args(url: str) -> dict[str, Any]:
    """The server's own account of its arguments (telemetry.server_info), from a sync caller."""
    from servetune.telemetry.server_info import fetch_server_info

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:  # safe inside a running event loop
        return pool.submit(asyncio.run, fetch_server_info(url)).result()


class Server:
    """One engine on one runner. ``start`` -> ``wait_ready`` -> ``stop`` (``stop`` is idempotent)."""

    def __init__(self, engine: EngineBase, runner: RunnerBase | None = None, *, port: int | None = None,
                 log_dir: Path | None = None):
        self.engine = engine
        self.runner = runner or LocalRunnerConfig()
        self.requested_port = port
        self.log_dir = Path(log_dir) if log_dir else default_log_dir()
        self.backend = None if not engine.launches else make_backend(self.runner)
        self.port: int | None = None
        self.argv: list[str] = []
        self.env: dict[str, str] = dict(engine.env)
        self.secret_files: dict[str, str] = {}
        self.known = known_secrets(env=engine.env, values=getattr(engine, "args", None))
        install_log_redaction()  # every log line of this process, not only ours
        remember(self.known)
        self.log_path: Path | None = None
        self.running: RunningServer | None = None
        self.preflight_report: PreflightReport | None = None
        self.teardown_report: TeardownReport | None = None
        self.parser_verdict = None
        self._started = False
        self._stopped = False

    # --- explicit API
    def plan(self, *, dry_run: bool = False) -> list[str]:
        """Choose the port and build the exact command (nothing started; the runner is not touched in a dry run)."""
        if self.backend is None:
            return []
        self.port = self.backend.choose_port(self.requested_port, dry_run=dry_run)
        self._render(dry_run=dry_run)
        return redact_argv(self.backend.command(self.argv, self.env), self.known, env_names=self.env)

    def _render(self, *, dry_run: bool = False) -> None:
        """The launch argv from the engine config, its secret flags moved off it (``secure_launch``)."""
        argv = self.engine.launch_argv(host=self.backend.bind_host, port=self.backend.engine_port)
        self.known |= known_secrets(argv=argv)
        remember(self.known)
        self.argv, self.env, self.secret_files = secure_launch(self.engine, argv)
        if self.secret_files:
            paths = self.backend.stage_secrets(self.secret_files, dry_run=dry_run)
            self.argv += self.engine.secret_files_argv(paths)

    @property
    def shown_argv(self) -> list[str]:
        """The launch argv as logs and ``RunningServer.argv`` show it (secret flag values ``***``)."""
        return redact_argv(self.argv, self.known)

    def start(self) -> Server:
        """Preflight (clean environment), then launch. A dirty environment raises ``EngineFailure``."""
        if self._started:
            raise RuntimeError("already started")
        self._started = True
        if self.backend is None:
            return self
        self.plan()
        self.parser_verdict = self._check_flags_on_runner()
        if self.runner.check_clean:
            self.preflight_report = self.backend.preflight(self.port)
            log.info("preflight: port %s; %s", self.preflight_report.port, self.preflight_report.gpu)
            self.preflight_report.raise_if_dirty()
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
        self.log_path = self.log_dir / f"{self.engine.kind}-{self.port}-{stamp}.log"
        log.info("starting %s: %s (log %s)", self.engine.describe(), self.shown_argv, self.log_path)
        self.backend.launch(self.argv, self.env, self.log_path)
        return self

    def _check_flags_on_runner(self):
        """The engine's own parser on the runner has the last word on flags (SGLang's, where installed there)."""
        argv = self.engine.runner_check_argv(host=self.backend.bind_host, port=self.backend.engine_port)
        if argv is None:
            return None
        argv = redact_argv(argv, text=False)  # the parser checks a secret's type, not its value: "***" parses
        verdict = self.engine.read_runner_check(*self.backend.run_check(argv, self.env))
        if verdict.checked and not verdict.ok:
            raise EngineFailure(FailureKind.bad_flag, f"{self.engine.kind} {verdict.version} on the runner rejects "
                                f"the flags: {verdict.error}")
        if not verdict.checked:
            log.info("flags not checked by %s's own parser: %s", self.engine.display_name, verdict.note)
        elif verdict.note:
            log.warning("%s", verdict.note)
        self.engine = self.engine.adopt_runner_check(verdict)  # its version, its catalogue renders the argv
        self._render()
        return verdict

    @property
    def url(self) -> str:
        return self.engine.endpoint_url or f"http://{self.backend.url_host}:{self.port}"

    def tail_log(self, n: int = TAIL_LINES) -> list[str]:
        """The last log lines, secrets masked: a tail travels in failure reasons to results and the warehouse."""
        lines = self.backend.tail(n) if self.backend is not None else tail_file(self.log_path, n)
        return [redact_text(line, self.known) for line in lines]

    def wait_ready(self) -> RunningServer:
        """Poll the health endpoint until the deadline; an early exit or a timeout tears down and raises."""
        if not self._started:
            self.start()
        deadline = time.monotonic() + self.engine.ready_timeout_s
        try:
            while True:
                code = self.backend.returncode() if self.backend else None
                if code is not None:
                    raise failure_from_log(FailureKind.exited, f"{self.engine.describe()} exited with code {code} "
                                           "before it was ready", self.tail_log(), str(self.log_path),
                                           patterns=self.engine.log_patterns)
                remaining = deadline - time.monotonic()
                if any(http_ok(self.url + p, timeout_s=max(0.5, min(10.0, remaining)))
                       for p in self.engine.health_paths):
                    break
                if time.monotonic() >= deadline:
                    failure = failure_from_log(FailureKind.timeout, "", self.tail_log(), str(self.log_path),
                                               patterns=self.engine.log_patterns)
                    # a log pattern explains a hang (e.g. an OOM in a worker) better than "timeout" alone
                    raise EngineFailure(failure.kind, f"not ready after {self.engine.ready_timeout_s:g} s "
                                        f"({', '.join(self.engine.health_paths)})" + failure.reason,
                                        failure.log_tail, failure.log_path)
                time.sleep(min(self.runner.poll_interval_s, max(0.0, deadline - time.monotonic())))
        except BaseException:
            self.stop()
            raise
        if self.backend:
            self.backend.on_ready()
        self.running = RunningServer(
            url=self.url, host=self.backend.url_host if self.backend else self.url, port=self.port or 0,
            engine_kind=self.engine.kind, argv=self.shown_argv, log_path=self.log_path,
            pid=self.backend.pid if self.backend else None, model=self.engine.served_model,
            resolved_args=fetch_resolved_args(self.url), handle=self,
        )
        log.info("%s ready at %s", self.engine.describe(), self.url)
        return self.running

    def check_alive(self) -> None:
        """Raise ``EngineFailure(died)`` with the log tail if a launched engine has exited."""
        code = self.backend.returncode() if self.backend else None
        if code is not None:
            raise failure_from_log(FailureKind.died, f"{self.engine.describe()} exited with code {code} "
                                   "while serving", self.tail_log(), str(self.log_path),
                                   patterns=self.engine.log_patterns)

    def preflight_running(self) -> PreflightReport:
        """Before a trial on this server: no foreign GPU processes (ours are expected)."""
        if self.backend is None:
            return PreflightReport(ok=True, gpu="not ours to check (external endpoint)", port="not checked")
        return self.backend.running_preflight()

    def stop(self) -> TeardownReport:
        """Tear down: SIGTERM, grace, SIGKILL of the whole group; verify port and GPU memory. Never raises."""
        if self._stopped:
            return self.teardown_report or TeardownReport(clean=True)
        self._stopped = True
        t0 = time.monotonic()
        if self.backend is None or not self._started:
            self.teardown_report = TeardownReport(clean=True, gpu="not ours" if self.backend is None else "not started")
            return self.teardown_report
        try:
            signals, problems, free, gpu = self.backend.teardown()
        except Exception as exc:  # teardown must report, not mask the original failure
            log.exception("teardown of %s failed", self.engine.describe())
            signals, problems, free, gpu = [], [f"teardown error: {type(exc).__name__}: {exc}"], None, "not checked"
        self.teardown_report = TeardownReport(clean=not problems, problems=problems, signals=signals,
                                              port_free=free, gpu=gpu, seconds=time.monotonic() - t0)
        _scrub_file(self.log_path, self.known)
        level = logging.INFO if self.teardown_report.clean else logging.WARNING
        log.log(level, "teardown of %s: %s", self.engine.describe(), self.teardown_report)
        return self.teardown_report

    def __enter__(self) -> RunningServer:
        try:
            return self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _scrub_file(path: Path | None, known: set[str]) -> None:
    """The engine's log without the launch's secret values (an engine may print its own arguments)."""
    if not known or path is None or not path.is_file():
        return
    text = path.read_text(encoding="utf-8", errors="surrogateescape")
    clean = scrub(text, known)
    if clean != text:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(clean, encoding="utf-8", errors="surrogateescape")
        os.chmod(tmp, 0o600)
        tmp.replace(path)


@contextmanager
def provision(engine: EngineBase, runner: RunnerBase | None = None, *, port: int | None = None,
              log_dir: Path | None = None) -> Iterator[RunningServer]:
    """A ready server for the ``with`` body; torn down afterwards whatever happens (Ctrl-C included)."""
    server = Server(engine, runner, port=port, log_dir=log_dir)
    try:
        yield server.wait_ready()
    finally:
        server.stop()
