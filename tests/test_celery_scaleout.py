"""Scale-out: CeleryExecutor with one queue per GPU type, a real Celery worker per queue (Redis broker),
the real scheduler, dag-processor and API server, runs triggered through the REST API. A plan on an
`h200`-type runner must run its campaign on the `gpu-h200` worker, and nowhere else; a campaign whose engine
dies at start must leave a red run with its reason in the task log."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from airflow_fixtures import write_plan
from fake_engines.helpers import FAKE_ENGINES
from servetune import localdb
from servetune.commands.airflow import AirflowSetup, prepare

pytestmark = pytest.mark.slow
REDIS = ("127.0.0.1", 6379)


def _redis_answers() -> bool:
    try:
        with socket.create_connection(REDIS, timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not _redis_answers(), reason="no Redis on 127.0.0.1:6379 to act as the Celery broker")
def test_campaign_runs_on_the_worker_of_its_gpu_queue(pg_server_url, tmp_path):
    # the plan is in place before Airflow first parses the DAGs: every DAG version routes it to gpu-h200
    plans = tmp_path / "plans"
    write_plan(plans, "on-h200",
               runner={"kind": "local", "gpu_type": "h200"},
               stages={"correctness": {"requests": 1}, "baseline": {"concurrency": 2, "requests": 10, "warmup": 1},
                       "ramp": {"levels": [4], "requests": 10, "warmup": 1, "bisect": False},
                       "refine": {"enabled": False}})
    # the same runner, an engine that dies at start with a CUDA OOM (the fake SGLang, the real sglang argv path)
    path = write_plan(plans, "broken-h200", model="/models/fake",
               runner={"kind": "local", "gpu_type": "h200"},
               engine={"kind": "sglang", "model": "/models/fake", "python": sys.executable, "ready_timeout_s": 30,
                       "env": {"PYTHONPATH": str(FAKE_ENGINES), "FAKE_ENGINE_MODE": "oom"}})
    path.write_text(path.read_text().replace("name: tiny-sim", "name: broken-h200", 1))
    meta_url, wh_url = localdb.create_database(pg_server_url), localdb.create_database(pg_server_url)
    try:
        _run_on_celery(AirflowSetup(home=tmp_path / "airflow", metadata_url=meta_url, warehouse_url=wh_url,
                                    plans_dir=plans, results_dir=tmp_path / "results"), tmp_path)
    finally:
        for url in (meta_url, wh_url):
            localdb.drop_database(pg_server_url, make_url(url).database)


def _run_on_celery(airflow_setup: AirflowSetup, tmp_path: Path) -> None:
    api_port, log_port = _free_port(), _free_port()
    meta = make_url(airflow_setup.metadata_url).set(drivername="postgresql+psycopg2")
    airflow_setup.extra_env.update({
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CELERY__BROKER_URL": f"redis://127.0.0.1:6379/{uuid.uuid4().int % 14 + 1}",
        "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + meta.render_as_string(hide_password=False),
        "AIRFLOW__API__PORT": str(api_port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(log_port),
        "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",  # REST calls on loopback without a login
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",  # the workers log each workload they execute
    })
    prepare(airflow_setup)

    env = airflow_setup.env()
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: dict[str, subprocess.Popen] = {}

    def start(name: str, *args: str) -> None:
        out = (logs / f"{name}.log").open("w")
        procs[name] = subprocess.Popen(["airflow", *args], env=env, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)

    try:
        start("api", "api-server", "--port", str(api_port))
        start("scheduler", "scheduler")
        start("dag-processor", "dag-processor")
        start("worker-default", "celery", "worker", "--queues", "default", "--concurrency", "1",
              "--celery-hostname", "default@servetune-test", "--skip-serve-logs")
        start("worker-h200", "celery", "worker", "--queues", "gpu-h200", "--concurrency", "1",
              "--celery-hostname", "h200@servetune-test")
        # the run starts once the execution API answers (a task sent before would fail and wait out a retry)
        # and both workers are consuming their queues
        _wait_until(lambda: _answers(f"http://127.0.0.1:{api_port}/api/v2/monitor/health"), procs, 120)
        _wait_until(lambda: all(" ready." in (logs / f"worker-{w}.log").read_text() for w in ("default", "h200")),
                    procs, 120)
        api = f"http://127.0.0.1:{api_port}/api/v2"
        _rest(f"{api}/dags/servetune_weekly", {"is_paused": False}, "PATCH")  # new DAGs start paused
        run_id, bad_id = (f"manual__celery_{k}_{uuid.uuid4().hex[:8]}" for k in ("ok", "bad"))
        for rid, plan in ((run_id, "on-h200.yaml"), (bad_id, "broken-h200.yaml")):
            _rest(f"{api}/dags/servetune_weekly/dagRuns", {"dag_run_id": rid, "logical_date": None,
                                                           "conf": {"plans": [plan]}})
        states = {rid: _wait_for_run(airflow_setup.metadata_url, rid, timeout_s=420) for rid in (run_id, bad_id)}
        tail = {n: "\n".join((logs / f"{n}.log").read_text().splitlines()[-15:]) for n in procs}
        assert states == {run_id: "success", bad_id: "failed"}, json.dumps(tail, indent=1)[-6000:]
    finally:
        for p in procs.values():
            _stop(p)

    with psycopg.connect(localdb.libpq_dsn(airflow_setup.metadata_url)) as conn:
        rows = conn.execute("select task_id, queue, pool, state from task_instance where run_id = %s",
                            (run_id,)).fetchall()
        runs = {r[0] for r in conn.execute("select run_id from dag_run where dag_id = 'servetune_weekly'")}
    assert runs == {run_id, bad_id}  # unpausing started no campaign of its own (last Monday's)
    # the tasks that hold the GPU run on the GPU type's queue, in the runner's pool; the rest anywhere
    on_gpu = {"prepare", "provision", "protocols", "correctness", "baseline", "ramp", "refine", "recommend", "teardown"}
    campaign = {r[0].split(".", 1)[1]: r for r in rows if r[0].startswith("campaign_local.")}
    assert set(campaign) >= on_gpu and all(r[3] == "success" for r in campaign.values()), rows
    for task in on_gpu:
        assert campaign[task][1:3] == ("gpu-h200", "servetune-local"), campaign[task]
    ran = {w: _executed(logs / f"worker-{w}.log", run_id) for w in ("h200", "default")}
    assert on_gpu <= ran["h200"] and not on_gpu & ran["default"], ran
    assert "load" in ran["default"] | ran["h200"]
    exps = [json.loads(p.read_text()) for p in Path(airflow_setup.results_dir).glob("*/experiment.json")]
    assert [e["status"] for e in exps if e["dag_run_id"] == run_id] == ["done"]
    (bad,) = [e for e in exps if e["dag_run_id"] == bad_id]
    assert bad["status"] == "failed" and bad["status_reason"]
    # the stage tasks' logs (what the UI shows) hold one line per trial and the stage's outcome
    task_logs = {p.parts[-3].split("=", 1)[1]: p.read_text() for p in
                 (airflow_setup.home / "logs").glob(f"dag_id=servetune_weekly/run_id={run_id}/task_id=*/map_index=*/attempt=*.log")}
    # the red run: the outcome task failed with the campaign's reason in its log; teardown, load, report ran
    with psycopg.connect(localdb.libpq_dsn(airflow_setup.metadata_url)) as conn:
        bad_states = dict(conn.execute("select task_id, state from task_instance where run_id = %s",
                                       (bad_id,)).fetchall())
    assert bad_states["campaign_local.outcome"] == "failed", bad_states
    assert all(bad_states[f"campaign_local.{t}"] == "success" for t in ("teardown", "load", "report")), bad_states
    (outcome_log,) = (airflow_setup.home / "logs").glob(
        f"dag_id=servetune_weekly/run_id={bad_id}/task_id=campaign_local.outcome/map_index=*/attempt=*.log")
    assert f"campaign broken-h200 failed: {bad['status_reason']}" in outcome_log.read_text()
    ramp = task_logs["campaign_local.ramp"]
    assert "stage ramp:" in ramp and ("s GPU  pass" in ramp or "s GPU  fail" in ramp), ramp[-3000:]
    assert "Loading 'datasources'" not in "".join(task_logs.values())


def _executed(log: Path, run_id: str) -> set[str]:
    """Campaign tasks of ``run_id`` a worker's log says it executed."""
    import re

    found = set()
    for line in log.read_text().splitlines():
        if "Executing workload" in line and f"run_id='{run_id}'" in line:
            m = re.search(r"task_id='campaign_local\.([a-z_]+)'", line)
            if m:
                found.add(m.group(1))
    return found


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _rest(url: str, body: dict, method: str = "POST") -> dict:
    """One call to Airflow's REST API (JSON in, JSON out); an HTTP error fails the test with its body."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{method} {url}: {e.code} {e.read()[:500]!r}") from None


def _wait_until(ready, procs: dict[str, subprocess.Popen], timeout_s: float) -> None:
    """Poll ``ready`` (every 0.5 s) while every process lives; fail with the one that died, or on timeout."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        dead = [n for n, p in procs.items() if p.poll() is not None]
        assert not dead and time.monotonic() < deadline, f"not ready after {timeout_s} s; exited: {dead}"
        time.sleep(0.5)


def _wait_for_run(metadata_url: str, run_id: str, timeout_s: float) -> str | None:
    deadline = time.monotonic() + timeout_s
    state = None
    while time.monotonic() < deadline:
        with psycopg.connect(localdb.libpq_dsn(metadata_url)) as conn:
            row = conn.execute("select state from dag_run where run_id = %s", (run_id,)).fetchone()
        state = row[0] if row else None
        if state in ("success", "failed"):
            return state
        time.sleep(3)
    return state


def _stop(p: subprocess.Popen) -> None:
    import os
    import signal

    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=10)
