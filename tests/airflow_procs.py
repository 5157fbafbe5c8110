"""A real Airflow as separate processes (api-server, scheduler, dag-processor, workers) for the tests that
need the live scheduler, not `airflow dags test`: started, polled on events, killed and restarted."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import psycopg

from servetune import localdb
from servetune.commands.airflow import AirflowSetup


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def live_env(airflow_setup: AirflowSetup, api_port: int, **extra: str) -> None:
    """The settings every live-scheduler test shares: its own API port, REST calls on loopback without a
    login, a fast heartbeat and DAG refresh (the 2-core box is shared with the campaign), INFO logs, no
    weekly schedule."""
    airflow_setup.extra_env.update({
        "AIRFLOW__API__PORT": str(api_port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        # runs are the test's own: a Monday 04:00 UTC passing mid-test (the DAG parsed before it, unpaused after)
        # made the scheduler add servetune_weekly's scheduled run beside them (a fresh-clone run on 2026-12-07)
        "SERVETUNE_WEEKLY_CRON": "off",
        **extra,
    })


class AirflowProcesses:
    """Named Airflow processes, each in its own process group with its log under ``logs``."""

    def __init__(self, airflow_setup: AirflowSetup, logs: Path) -> None:
        self.env, self.logs = airflow_setup.env(), logs
        self.procs: dict[str, subprocess.Popen] = {}
        logs.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, *args: str) -> None:
        out = (self.logs / f"{name}.log").open("a")
        self.procs[name] = subprocess.Popen(["airflow", *args], env=self.env, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def start_components(self, api_port: int, *workers: tuple[str, ...], dag_id: str = "servetune_weekly") -> str:
        """The api-server, scheduler and dag-processor (and any ``workers``: (name, *args)), started; once the
        API answers (a task sent before would fail and wait out a retry), ``dag_id`` unpaused (new DAGs start
        paused). The REST API's base URL."""
        self.start("api", "api-server", "--port", str(api_port))
        self.start("scheduler", "scheduler")
        self.start("dag-processor", "dag-processor")
        for name, *args in workers:
            self.start(name, *args)
        api = f"http://127.0.0.1:{api_port}/api/v2"
        self.wait_until(lambda: answers(f"{api}/monitor/health"), 120)
        rest(f"{api}/dags/{dag_id}", {"is_paused": False}, "PATCH")
        return api

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def wait_until(self, ready, timeout_s: float) -> None:
        """Poll ``ready`` (every 0.5 s) while every process lives; fail with the one that died, or on timeout."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            assert not dead, f"exited while waiting: {dead}; {self.tails()[-3000:]}"
            assert time.monotonic() < deadline, f"not ready after {timeout_s} s; {self.tails()[-3000:]}"
            time.sleep(0.5)

    def kill(self, name: str, spare: Callable[[psutil.Process], bool] = lambda proc: False) -> list[int]:
        """SIGKILL the process and every descendant, those in process groups of their own too (Airflow's
        task processes), except what ``spare`` keeps: a crash, not a shutdown. The PIDs killed."""
        p = self.procs.pop(name)
        try:
            tree = [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        killed = []
        for proc in tree:
            try:
                if not spare(proc):
                    proc.kill()
                    killed.append(proc.pid)
            except psutil.Error:
                pass
        p.wait(timeout=30)
        return killed

    def stop_all(self) -> None:
        for name in list(self.procs):
            stop(self.procs.pop(name))

    def tails(self, lines: int = 15) -> str:
        return json.dumps({n: "\n".join(self.log(n).splitlines()[-lines:]) for n in self.procs}, indent=1)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def rest(url: str, body: dict, method: str = "POST") -> dict:
    """One call to Airflow's REST API (JSON in, JSON out); an HTTP error fails the test with its body."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{method} {url}: {e.code} {e.read()[:500]!r}") from None


def trigger(api: str, dag_id: str, run_id: str, conf: dict) -> None:
    rest(f"{api}/dags/{dag_id}/dagRuns", {"dag_run_id": run_id, "logical_date": None, "conf": conf})


def run_state(metadata_url: str, run_id: str) -> str | None:
    with psycopg.connect(localdb.libpq_dsn(metadata_url)) as conn:
        row = conn.execute("select state from dag_run where run_id = %s", (run_id,)).fetchone()
    return row[0] if row else None


def task_states(metadata_url: str, run_id: str) -> dict[str, str | None]:
    with psycopg.connect(localdb.libpq_dsn(metadata_url)) as conn:
        return dict(conn.execute("select task_id, state from task_instance where run_id = %s",
                                 (run_id,)).fetchall())


def run_report(airflow_setup: AirflowSetup, run_id: str, lines: int = 25) -> str:
    """What a failed assertion on a run should show: every task's state and the last ``lines`` of each failed
    or retried task's logs (the components' own logs rarely say why a task failed)."""
    states = task_states(airflow_setup.metadata_url, run_id)
    logs = airflow_setup.home / "logs" / "dag_id=servetune_weekly" / f"run_id={run_id}"
    tails = {}
    for task_id, state in states.items():
        if state in ("failed", "up_for_retry", "upstream_failed") or (logs / f"task_id={task_id}").is_dir() and \
                any((logs / f"task_id={task_id}").glob("**/attempt=2.log")):
            for path in sorted(logs.glob(f"task_id={task_id}/**/attempt=*.log")):
                tails[str(path.relative_to(logs))] = path.read_text(errors="replace").splitlines()[-lines:]
    return json.dumps({"states": states, "logs": tails}, indent=1)


def wait_for_run(metadata_url: str, run_id: str, timeout_s: float) -> str | None:
    """The run's final state (success or failed), or the state it was in at the timeout."""
    deadline = time.monotonic() + timeout_s
    state = None
    while time.monotonic() < deadline:
        state = run_state(metadata_url, run_id)
        if state in ("success", "failed"):
            return state
        time.sleep(2)
    return state


def stop(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=10)
