"""The engine as a subprocess of this machine: its own process group, chosen GPUs, a free port, a log file."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

import psutil

from servetune.runners.base import LocalRunnerConfig, gpu_env, tail_file
from servetune.runners.preflight import PreflightReport, check_clean, free_port, wait_gpu_released, wait_port_free
from servetune.runners.process import GuardedProcess


class LocalBackend:
    def __init__(self, cfg: LocalRunnerConfig):
        self.cfg = cfg
        self.process: GuardedProcess | None = None
        self.port: int | None = None
        self.secret_dir: Path | None = None
        self.log_path: Path | None = None

    def tail(self, n: int) -> list[str]:
        """The last ``n`` lines of the engine's log (the file it writes here)."""
        return tail_file(self.log_path, n)

    @property
    def bind_host(self) -> str:
        return self.cfg.host

    @property
    def url_host(self) -> str:
        return "127.0.0.1" if self.cfg.host in ("0.0.0.0", "::", "") else self.cfg.host

    def choose_port(self, port: int | None, *, dry_run: bool = False) -> int:
        self.port = port if port is not None else free_port(self.url_host)
        return self.port

    @property
    def engine_port(self) -> int | None:
        return self.port

    def engine_env(self, extra: Mapping[str, str]) -> dict[str, str]:
        """Only what differs from our own environment (shown by --dry-run; the rest is inherited)."""
        return gpu_env(self.cfg.gpus, dict(extra))

    def command(self, argv: list[str], extra_env: Mapping[str, str]) -> list[str]:
        """The exact command, environment included (``env K=V argv``), as --dry-run prints it (values masked
        by the caller: the launch passes the environment itself, never on a command line)."""
        env = self.engine_env(extra_env)
        return (["env", *(f"{k}={v}" for k, v in env.items())] if env else []) + argv

    def run_check(self, argv: list[str], extra_env: Mapping[str, str],
                  timeout_s: float = 180.0) -> tuple[int, str, str]:
        """A short command on the runner (SGLang's own parser check): ``(exit code, stdout, stderr)``."""
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL,
                                  env={**os.environ, **self.engine_env(extra_env)}, cwd=self.cfg.cwd)
        except FileNotFoundError as exc:
            return 127, "", str(exc)
        return proc.returncode, proc.stdout, proc.stderr

    def stage_secrets(self, files: Mapping[str, str], *, dry_run: bool = False) -> dict[str, str]:
        """Files only the engine's user may read (a fresh 0700 directory, each file 0600), removed once the
        engine is ready or torn down; their paths. A dry run writes nothing."""
        if dry_run:
            return {name: str(Path(tempfile.gettempdir()) / "servetune-secrets-XXXXXXXX" / name) for name in files}
        self.drop_secrets()
        self.secret_dir = Path(tempfile.mkdtemp(prefix="servetune-secrets-"))
        for name, text in files.items():
            fd = os.open(self.secret_dir / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
        return {name: str(self.secret_dir / name) for name in files}

    def drop_secrets(self) -> None:
        if self.secret_dir is not None:
            shutil.rmtree(self.secret_dir, ignore_errors=True)
            self.secret_dir = None

    def preflight(self, port: int) -> PreflightReport:
        return check_clean(host=self.bind_host, port=port, gpus=self.cfg.gpus, idle_mib=self.cfg.gpu_idle_mib)

    def launch(self, argv: list[str], extra_env: Mapping[str, str], log_path: Path) -> None:
        self.log_path = log_path
        env = {**os.environ, **self.engine_env(extra_env)}
        self.process = GuardedProcess(argv, env=env, log_path=log_path, cwd=self.cfg.cwd,
                                      watchdog_grace_s=min(self.cfg.grace_s, 10.0))

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def returncode(self) -> int | None:
        return self.process.poll() if self.process else None

    def on_ready(self) -> None:
        self.drop_secrets()  # the engine read them at start-up
        if self.process:
            self.process.remember_descendants()

    def own_pids(self) -> set[int]:
        if not self.process:
            return set()
        pids = {self.process.pid}
        try:
            pids |= {c.pid for c in psutil.Process(self.process.pid).children(recursive=True)}
        except psutil.Error:
            pass
        return pids

    def running_preflight(self) -> PreflightReport:
        return check_clean(host=self.bind_host, port=None, gpus=self.cfg.gpus, idle_mib=self.cfg.gpu_idle_mib,
                           own_pids=self.own_pids())

    def teardown(self) -> tuple[list[str], list[str], bool | None, str]:
        """``(signals, problems, port_free, gpu verdict)``."""
        self.drop_secrets()
        if self.process is None:
            return [], [], None, "not checked"
        signals, problems = self.process.stop(self.cfg.grace_s)
        free = wait_port_free(self.bind_host, self.port) if self.port is not None else None
        if free is False:
            problems.append(f"port {self.port} still in use after teardown")
        gpu = wait_gpu_released(self.cfg.gpus, idle_mib=self.cfg.gpu_idle_mib, timeout_s=self.cfg.gpu_release_timeout_s)
        if gpu.startswith("not released"):
            problems.append(f"GPU memory {gpu}")
        return signals, problems, free, gpu
