"""Scale-out: CeleryExecutor with one queue per GPU type, a real Celery worker per queue (Redis broker),
the real scheduler, dag-processor and API server, runs triggered through the REST API. A plan on an
`h200`-type runner must run its campaign on the `gpu-h200` worker, and nowhere else; a campaign whose engine
dies at start must leave a red run with its reason in the task log."""

from __future__ import annotations

import json
import socket
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from airflow_fixtures import write_plan
from airflow_procs import AirflowProcesses, free_port, live_env, task_states, trigger, wait_for_run
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
    write_plan(plans, "broken-h200", name="broken-h200", model="/models/fake",
               runner={"kind": "local", "gpu_type": "h200"},
               engine={"kind": "sglang", "model": "/models/fake", "python": sys.executable, "ready_timeout_s": 30,
                       "env": {"PYTHONPATH": str(FAKE_ENGINES), "FAKE_ENGINE_MODE": "oom"}})
    meta_url, wh_url = localdb.create_database(pg_server_url), localdb.create_database(pg_server_url)
    try:
        _run_on_celery(AirflowSetup(home=tmp_path / "airflow", metadata_url=meta_url, warehouse_url=wh_url,
                                    plans_dir=plans, results_dir=tmp_path / "results"), tmp_path)
    finally:
        for url in (meta_url, wh_url):
            localdb.drop_database(pg_server_url, make_url(url).database)


def _run_on_celery(airflow_setup: AirflowSetup, tmp_path: Path) -> None:
    api_port = free_port()
    meta = make_url(airflow_setup.metadata_url).set(drivername="postgresql+psycopg2")
    live_env(airflow_setup, api_port,
             AIRFLOW__CORE__EXECUTOR="CeleryExecutor",
             AIRFLOW__CELERY__BROKER_URL=f"redis://127.0.0.1:6379/{uuid.uuid4().int % 14 + 1}",
             AIRFLOW__CELERY__RESULT_BACKEND="db+" + meta.render_as_string(hide_password=False),
             AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(free_port()))  # the workers log each workload
    prepare(airflow_setup)
    af = AirflowProcesses(airflow_setup, tmp_path / "logs")
    try:
        api = af.start_components(
            api_port,
            ("worker-default", "celery", "worker", "--queues", "default", "--concurrency", "1",
             "--celery-hostname", "default@servetune-test", "--skip-serve-logs"),
            ("worker-h200", "celery", "worker", "--queues", "gpu-h200", "--concurrency", "1",
             "--celery-hostname", "h200@servetune-test"))
        # the run starts once both workers are consuming their queues too
        af.wait_until(lambda: all(" ready." in af.log(f"worker-{w}") for w in ("default", "h200")), 120)
        run_id, bad_id = (f"manual__celery_{k}_{uuid.uuid4().hex[:8]}" for k in ("ok", "bad"))
        for rid, plan in ((run_id, "on-h200.yaml"), (bad_id, "broken-h200.yaml")):
            trigger(api, "servetune_weekly", rid, {"plans": [plan]})
        states = {rid: wait_for_run(airflow_setup.metadata_url, rid, timeout_s=420) for rid in (run_id, bad_id)}
        assert states == {run_id: "success", bad_id: "failed"}, af.tails()[-6000:]
    finally:
        af.stop_all()

    with psycopg.connect(localdb.libpq_dsn(airflow_setup.metadata_url)) as conn:
        rows = conn.execute("select task_id, queue, pool, state from task_instance where run_id = %s",
                            (run_id,)).fetchall()
        runs = {r[0] for r in conn.execute("select run_id from dag_run where dag_id = 'servetune_weekly'")}
    assert runs == {run_id, bad_id}  # unpausing started no campaign of its own (last Monday's)
    # the tasks that hold the GPU run on the GPU type's queue, in the runner's pool; the rest anywhere
    on_gpu = {"prepare", "provision", "protocols", "correctness", "baseline", "ramp", "refine", "recommend", "teardown"}
    campaign = {r[0].split(".", 1)[1]: r for r in rows if r[0].startswith("campaign_local.")}
    assert set(campaign) >= on_gpu and all(r[3] == "success" for t, r in campaign.items() if t != "approve"), rows
    assert campaign["approve"][3] == "skipped", rows  # the model's first answer: servetune accepted it
    for task in on_gpu:
        assert campaign[task][1:3] == ("gpu-h200", "servetune-local"), campaign[task]
    ran = {w: _executed(af.logs / f"worker-{w}.log", run_id) for w in ("h200", "default")}
    assert on_gpu <= ran["h200"] and not on_gpu & ran["default"], ran
    assert "load" in ran["default"] | ran["h200"]
    exps = [json.loads(p.read_text()) for p in Path(airflow_setup.results_dir).glob("*/experiment.json")]
    assert [e["status"] for e in exps if e["dag_run_id"] == run_id] == ["done"]
    (bad,) = [e for e in exps if e["dag_run_id"] == bad_id]
    assert bad["status"] == "failed" and bad["status_reason"]
    # the stage tasks' logs (what the UI shows) hold one line per trial and the stage's outcome
    task_logs = {p.parts[-3].split("=", 1)[1]: p.read_text() for p in (airflow_setup.home / "logs").glob(
        f"dag_id=servetune_weekly/run_id={run_id}/task_id=*/map_index=*/attempt=*.log")}
    # the red run: the outcome task failed with the campaign's reason in its log; teardown, load, report ran
    bad_states = task_states(airflow_setup.metadata_url, bad_id)
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
