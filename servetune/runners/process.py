"""A command in its own process group that cannot outlive us, and a teardown that leaves nothing behind.

Three layers, because each covers a case the others miss: ``start_new_session`` + ``killpg``
(the engine's worker processes); PR_SET_PDEATHSIG on the direct child (only when started from the
main thread: the signal follows the *thread* that forked, and a worker thread's exit would kill a
healthy engine); a watchdog process that kills the group when our process disappears, even by
SIGKILL. Descendants that left the group (their own ``setsid``) are found too: noted with psutil while
they are descendants, and by the tag every process of the tree inherits (``SERVETUNE_ENGINE_TREE``) once
they are orphans; the watchdog uses the same tag.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from servetune.runners.watchdog import TAG_VAR, tagged

log = logging.getLogger(__name__)

WATCHDOG = Path(__file__).with_name("watchdog.py")
_PR_SET_PDEATHSIG = 1


def _pdeathsig_preexec():
    """A preexec_fn setting PR_SET_PDEATHSIG=SIGKILL (Linux), or None where it does not apply."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def _set() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return _set


def _private_append(path: Path):
    """``path`` opened for appending, created 0600 (readable by us alone) when new."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of a process group."""
    out = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                out.append(proc)
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return out


class GuardedProcess:
    """``argv`` in a new session (its PGID is its PID), output appended to ``log_path``."""

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str], log_path: Path, cwd: Path | None = None,
                 watchdog_grace_s: float = 5.0, stderr_path: Path | None = None, keep_stdin_open: bool = False,
                 stdin_data: bytes | None = None):
        """``keep_stdin_open``: the child's stdin is a pipe we hold; it reads EOF exactly when we are gone.
        ``stdin_data`` is written to that pipe first (a script with secrets that must stay off argv).
        Logs are created 0600: an engine may print its own arguments."""
        self.argv = list(argv)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        self.tag = uuid.uuid4().hex
        with _private_append(log_path) as log_fh, _private_append(stderr_path or log_path) as err_fh:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE if keep_stdin_open else subprocess.DEVNULL, stdout=log_fh,
                stderr=subprocess.STDOUT if stderr_path is None else err_fh,
                env={**env, TAG_VAR: self.tag}, cwd=cwd, start_new_session=True, preexec_fn=_pdeathsig_preexec(),
            )
        self.pgid = self.proc.pid
        if stdin_data is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(stdin_data)
                self.proc.stdin.flush()
            except BrokenPipeError:  # the child is already gone: its exit code tells why
                pass
        self._known: dict[int, psutil.Process] = {}
        self.watchdog = subprocess.Popen(
            [sys.executable, "-I", str(WATCHDOG), str(os.getpid()), str(self.pgid), str(watchdog_grace_s), self.tag],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def remember_descendants(self) -> None:
        """Note the engine's process tree now, so workers that leave the group are still found at teardown
        (descendants, and orphans by their tag)."""
        try:
            for child in psutil.Process(self.pid).children(recursive=True):
                self._known[child.pid] = child
        except psutil.Error:
            pass
        for pid in tagged(self.tag):
            try:
                self._known.setdefault(pid, psutil.Process(pid))
            except psutil.Error:
                continue

    def alive_processes(self) -> list[psutil.Process]:
        procs = {p.pid: p for p in group_members(self.pgid)}
        for pid, proc in self._known.items():
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    procs.setdefault(pid, proc)
            except psutil.Error:
                continue
        return list(procs.values())

    def stop(self, grace_s: float) -> tuple[list[str], list[str]]:
        """SIGTERM the group, wait ``grace_s``, SIGKILL what is left; ``(signals sent, problems)``."""
        self.remember_descendants()
        signals: list[str] = []
        problems: list[str] = []
        if self.alive_processes():
            self._signal_all(signal.SIGTERM)
            signals.append("SIGTERM")
            self._wait_gone(grace_s)
        if self.alive_processes():
            self._signal_all(signal.SIGKILL)
            signals.append("SIGKILL")
            self._wait_gone(10.0)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            problems.append(f"process {self.pid} did not exit after SIGKILL")
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        left = self.alive_processes()
        if left:
            problems.append("processes left after SIGKILL: " + ", ".join(str(p.pid) for p in left))
        self._stop_watchdog()
        return signals, problems

    def _signal_all(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            pass
        for proc in self.alive_processes():  # the ones that escaped the group
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass

    def _wait_gone(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.proc.poll()  # reap the leader so it does not linger as a zombie
            if not self.alive_processes():
                return
            time.sleep(0.1)

    def _stop_watchdog(self) -> None:
        if self.watchdog.poll() is None:
            self.watchdog.kill()
        try:
            self.watchdog.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.warning("watchdog %s did not exit", self.watchdog.pid)
