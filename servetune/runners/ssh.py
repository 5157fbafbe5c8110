"""The engine on another host over SSH: the system ``ssh`` client, a local port forward, a remote process group.

The remote command runs under ``setsid -w`` so its PGID is known (printed as the first log line)
and teardown can kill the whole remote group. The ssh client's stdin is a pipe only we hold: if our
side disappears (even by SIGKILL; the local watchdog also kills the ssh client), the remote end
reads EOF on stdin and kills its own group.

The engine's environment (``HF_TOKEN``...) and any secret file travel down that same pipe first, read
by the remote script up to an end mark; never on a command line, where the remote host's ``ps`` and our
own would show them. Only the engine's argv (free of secrets, ``lifecycle.secure_launch``) is on one.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from servetune.runners.base import SSHRunnerConfig, gpu_env, tail_file
from servetune.runners.preflight import (
    REMOTE_PROBE,
    PreflightReport,
    free_port,
    port_free,
    remote_probe_json,
    report_from_remote,
)
from servetune.runners.process import GuardedProcess

PGID_MARK = "servetune-remote-pgid"
ENV_END = "__servetune_env_end__"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The environment block arrives on stdin, one line at a time up to ENV_END (``read`` takes no byte more),
# and is evaluated here: its values never appear on a command line.
READ_ENV = f"""block=
while IFS= read -r line; do
  [ "$line" = "{ENV_END}" ] && break
  block="$block$line
"
done
eval "$block" || exit 1
"""
# $0 name, $1 workdir, then the command. fd 3 keeps the rest of the ssh channel's stdin: its EOF means we
# are gone. POSIX `kill -s SIG -- -PGID` (dash's kill rejects `kill -TERM -- -PGID`).
REMOTE_SCRIPT = f"""echo "{PGID_MARK} $$"
secrets=
{READ_ENV}if [ -n "$1" ]; then cd "$1" || exit 1; fi
shift
exec 3<&0
( trap '' TERM; cat <&3 >/dev/null; [ -n "$secrets" ] && rm -rf "$secrets"; kill -s TERM -- -$$; sleep 5
  kill -s KILL -- -$$ ) </dev/null >/dev/null 2>&1 &
exec "$@" 3<&- </dev/null 2>&1
"""


def exports(env: Mapping[str, str]) -> str:
    """``export K='v'`` lines for a script read on stdin (values quoted for the shell, never on argv)."""
    bad = [k for k in env if not _NAME.fullmatch(k)]
    if bad:
        raise ValueError(f"environment variable names must be shell identifiers, got {bad}")
    return "".join(f"export {k}={shlex.quote(str(v))}\n" for k, v in env.items())


def secret_files_script(directory: str | None, files: Mapping[str, str]) -> str:
    """Write ``files`` into a new 0700 ``directory`` (0600 files; mkdir fails if it exists: nobody else's)."""
    if not directory or not files:
        return ""
    out = [f"secrets={shlex.quote(directory)}", "( umask 077", 'mkdir -m 700 "$secrets" || exit 1']
    for name, text in files.items():
        mark = f"SERVETUNE_EOF_{uuid.uuid4().hex}"
        out.append(f'cat > "$secrets"/{shlex.quote(name)} <<\'{mark}\'\n{text.rstrip(chr(10))}\n{mark}')
    return "\n".join(out) + "\n) || exit 1\n"  # the umask ends with the subshell: the engine keeps its own


_FORWARD_NOISE = re.compile(r"^channel \d+: open failed: connect failed")


class SSHError(RuntimeError):
    pass


class SSHBackend:
    def __init__(self, cfg: SSHRunnerConfig):
        self.cfg = cfg
        self.process: GuardedProcess | None = None
        self.port: int | None = None  # local end of the forward
        self.remote_port: int | None = cfg.remote_port
        self.remote_pgid: int | None = None
        self.secret_dir: str | None = None
        self._secret_files: dict[str, str] = {}

    bind_host = "127.0.0.1"  # the engine binds loopback on the remote host; we reach it through the forward
    url_host = "127.0.0.1"

    # --- ssh plumbing
    def ssh_base(self) -> list[str]:
        c = self.cfg
        argv = ["ssh", "-T", "-o", "BatchMode=yes", "-o", f"StrictHostKeyChecking={c.strict_host_key_checking}",
                "-o", f"ConnectTimeout={c.connect_timeout_s}", "-p", str(c.ssh_port)]
        if c.known_hosts_file:
            argv += ["-o", f"UserKnownHostsFile={c.known_hosts_file}"]
        if c.identity_file:
            argv += ["-i", str(c.identity_file), "-o", "IdentitiesOnly=yes"]
        for opt in c.ssh_options:
            argv += ["-o", opt]
        return argv

    def run_remote(self, argv: list[str], *, timeout_s: float = 60.0,
                   env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """One remote command; its argv is quoted for the remote shell (ssh sends a single string);
        ``env`` goes down stdin (``READ_ENV``), never on the command line."""
        if env:
            remote = ["sh", "-c", READ_ENV + 'exec "$@"', "servetune-check", *argv]
            cmd = self.ssh_base() + [self.cfg.destination, "--", shlex.join(remote)]
            return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                                  input=exports(env) + ENV_END + "\n")
        cmd = self.ssh_base() + [self.cfg.destination, "--", shlex.join(argv)]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)

    def _remote_probe(self, port: int | None) -> dict:
        gpus = ",".join(str(g) for g in self.cfg.gpus) if self.cfg.gpus is not None else "-"
        proc = self.run_remote([self.cfg.remote_python, "-c", REMOTE_PROBE, str(port) if port else "-", gpus])
        if proc.returncode != 0:
            raise SSHError(f"remote preflight on {self.cfg.destination} failed (exit {proc.returncode}): "
                           f"{proc.stderr.strip()[-500:]}")
        return remote_probe_json(proc.stdout)

    # --- the backend interface
    def choose_port(self, port: int | None, *, dry_run: bool = False) -> int:
        """Our local forward port; the remote engine port comes from the remote host (or 30000 in a dry run)."""
        if self.remote_port is None:
            self.remote_port = 30000 if dry_run else int(self._remote_probe(None)["free_port"])
        self.port = port if port is not None else free_port(self.url_host)
        return self.port

    @property
    def engine_port(self) -> int | None:
        return self.remote_port

    def engine_env(self, extra: Mapping[str, str]) -> dict[str, str]:
        return gpu_env(self.cfg.gpus, dict(extra))

    def remote_argv(self, argv: list[str]) -> list[str]:
        """What the remote host runs: REMOTE_SCRIPT, which takes the engine's environment from stdin."""
        return ["setsid", "-w", "sh", "-c", REMOTE_SCRIPT, "servetune-engine", self.cfg.workdir or "", *argv]

    def launch_input(self, extra_env: Mapping[str, str]) -> str:
        """The remote shell's stdin: the engine's environment and any secret files, then the end mark."""
        return (exports(self.engine_env(extra_env)) + secret_files_script(self.secret_dir, self._secret_files)
                + ENV_END + "\n")

    def stage_secrets(self, files: Mapping[str, str], *, dry_run: bool = False) -> dict[str, str]:
        """Secret files on the remote host: written by the launch script into a new 0700 directory with an
        unguessable name, removed once the engine is ready or torn down; their remote paths."""
        self.secret_dir = f"/tmp/servetune-secrets-{uuid.uuid4().hex}"
        self._secret_files = dict(files)
        return {name: f"{self.secret_dir}/{name}" for name in files}

    def drop_secrets(self) -> None:
        if self.secret_dir is not None and self.process is not None:
            try:
                self.run_remote(["rm", "-rf", "--", self.secret_dir], timeout_s=30)
            except (OSError, subprocess.SubprocessError):
                pass  # the launch script's watcher removes it too when the engine's group ends
            self.secret_dir = None

    def command(self, argv: list[str], extra_env: Mapping[str, str]) -> list[str]:
        assert self.port is not None and self.remote_port is not None
        return self.ssh_base() + [
            "-o", "ExitOnForwardFailure=yes", "-o", "ServerAliveInterval=15",
            "-L", f"127.0.0.1:{self.port}:127.0.0.1:{self.remote_port}",
            self.cfg.destination, "--", shlex.join(self.remote_argv(argv)),
        ]

    def run_check(self, argv: list[str], extra_env: Mapping[str, str],
                  timeout_s: float = 180.0) -> tuple[int, str, str]:
        proc = self.run_remote(argv, timeout_s=timeout_s, env=self.engine_env(extra_env))
        return proc.returncode, proc.stdout, proc.stderr

    def preflight(self, port: int) -> PreflightReport:
        data = self._remote_probe(self.remote_port)
        report = report_from_remote(data, host=self.cfg.host, port=self.remote_port, idle_mib=self.cfg.gpu_idle_mib)
        if not port_free(self.url_host, port):
            report.ok = False
            report.problems.append(f"local forward port {port} is already in use")
        return report

    def launch(self, argv: list[str], extra_env: Mapping[str, str], log_path: Path) -> None:
        import os

        self._log_path = log_path
        self.ssh_log_path = log_path.with_suffix(".ssh.log")  # the ssh client's own messages, kept apart
        self.process = GuardedProcess(self.command(argv, extra_env), env=dict(os.environ), log_path=log_path,
                                      watchdog_grace_s=2.0, stderr_path=self.ssh_log_path, keep_stdin_open=True,
                                      stdin_data=self.launch_input(extra_env).encode())

    def tail(self, n: int) -> list[str]:
        """The engine's log, then what ssh itself said (minus the forward's "not listening yet" noise)."""
        ssh_lines = [ln for ln in tail_file(self.ssh_log_path, n) if not _FORWARD_NOISE.search(ln)]
        engine = tail_file(self._log_path, n)
        return (engine + [f"[ssh] {ln}" for ln in ssh_lines])[-n:]

    @property
    def pid(self) -> int | None:
        return self._find_pgid()

    def _find_pgid(self) -> int | None:
        if self.remote_pgid is None and self.process is not None:
            for line in tail_file(self._log_path, 2000):
                m = re.match(rf"{PGID_MARK} (\d+)$", line.strip())
                if m:
                    self.remote_pgid = int(m.group(1))
                    break
        return self.remote_pgid

    def returncode(self) -> int | None:
        return self.process.poll() if self.process else None

    def on_ready(self) -> None:
        self._find_pgid()
        self.drop_secrets()  # the engine read them at start-up

    def running_preflight(self) -> PreflightReport:
        data = self._remote_probe(None)
        own = set()
        if self.remote_pgid:
            ps = self.run_remote(["sh", "-c", f"ps -o pid= -g {self.remote_pgid} 2>/dev/null || true"])
            own = {int(x) for x in ps.stdout.split() if x.isdigit()}
        return report_from_remote(data, host=self.cfg.host, port=None, idle_mib=self.cfg.gpu_idle_mib,
                                  own_gpu_pids=own or {0})

    def _remote_group_alive(self, pgid: int, timeout_s: float = 5.0) -> bool:
        """Whether the remote group still exists after a few seconds (killed processes need reaping)."""
        tries = max(1, int(timeout_s / 0.1))
        script = (f"i=0; while [ $i -lt {tries} ]; do kill -s 0 -- -{pgid} 2>/dev/null || {{ echo gone; exit 0; }}; "
                  "sleep 0.1; i=$((i+1)); done; echo alive")
        proc = self.run_remote(["sh", "-c", script], timeout_s=timeout_s + 30)
        return "alive" in proc.stdout

    def teardown(self) -> tuple[list[str], list[str], bool | None, str]:
        self.drop_secrets()
        if self.process is None:
            return [], [], None, "not checked"
        signals: list[str] = []
        problems: list[str] = []
        pgid = self._find_pgid()
        if pgid is not None:
            if self.process.poll() is None:
                self.run_remote(["kill", "-s", "TERM", "--", f"-{pgid}"])
                signals.append("SIGTERM")
                deadline = time.monotonic() + self.cfg.grace_s
                while self.process.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.1)
            # sweep: the engine if it ignored SIGTERM, and the stdin watcher, which ignores it on purpose
            self.run_remote(["kill", "-s", "KILL", "--", f"-{pgid}"])
            signals.append("SIGKILL")
        local_signals, local_problems = self.process.stop(2.0)
        problems += local_problems
        if pgid is not None and self._remote_group_alive(pgid):
            problems.append(f"remote process group {pgid} on {self.cfg.host} still alive")
        elif pgid is None:
            problems.append("remote PGID unknown (engine never started?); remote processes not verified")
        data = self._remote_probe(self.remote_port)
        free = bool(data.get("port_free"))
        if not free:
            problems.append(f"remote port {self.remote_port} still in use after teardown")
        gpu = data.get("gpu")
        if gpu is None:
            gpu_text = f"no GPU ({data.get('gpu_error', 'NVML unavailable')})"
        else:
            busy = {i: b for i, b in gpu["memory_used"].items() if b > self.cfg.gpu_idle_mib * 1024 * 1024}
            gpu_text = "released" if not busy else "not released: " + ", ".join(
                f"GPU {i} {b / 2**20:.0f} MiB" for i, b in busy.items())
            if busy:
                problems.append(f"GPU memory {gpu_text}")
        return signals, problems, free, gpu_text
