"""An Airflow restart mid-campaign is survived without a hand: the scheduler, its LocalExecutor workers and
the running ramp task are killed (SIGKILL, no clean shutdown) together with the API server, Airflow comes
back with the API server last (as a slow one does), and the run still finishes green with every trial once,
a log line each, and no engine left behind; on the same scheduler a campaign whose engine dies is a red run (a
plan with a typo beside it fails alone, at once), and so is a run marked failed over REST mid-campaign (its
teardown fails it)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psutil
import psycopg
import pytest

from airflow_fixtures import write_plan
from airflow_procs import AirflowProcesses, free_port, live_env, rest, run_report, task_states, trigger, wait_for_run
from fake_engines.helpers import FAKE_ENGINES
from servetune import localdb
from servetune.runners.sweep import OWNER_ENV

pytestmark = pytest.mark.slow
RAMP = "campaign_local.ramp"
TEARDOWN = "campaign_local.teardown"
RUN_ID = "manual__restart"
STOPPED = "manual__stopped"


@pytest.mark.timeout(1800)  # its own waits add up to ~22 min at worst: they, not the global 600 s, should speak
def test_a_killed_scheduler_and_task_mid_ramp_recover_on_their_own(airflow_setup, tmp_path):
    # a ramp of four levels, each trial a few seconds of the simulated engine: long enough to be cut
    write_plan(airflow_setup.plans_dir, "restart", name="restart-sim",
               workload={"name": "restart", "seed": 1, "input": {"kind": "uniform", "min": 64, "max": 256},
                         "output": {"kind": "fixed", "value": 48}},
               stages={"correctness": {"requests": 1}, "baseline": {"concurrency": 2, "requests": 16, "warmup": 2},
                       "ramp": {"levels": [4, 6, 8, 10], "requests": 40, "warmup": 2, "bisect": False},
                       "refine": {"enabled": False}})
    write_plan(airflow_setup.plans_dir, "broken", name="broken", model="/models/fake",
               engine={"kind": "sglang", "model": "/models/fake", "python": sys.executable, "ready_timeout_s": 30,
                       "env": {"PYTHONPATH": str(FAKE_ENGINES), "FAKE_ENGINE_MODE": "oom"}})
    api_port = free_port()
    # how soon the restarted scheduler gives up on the dead one's tasks (Airflow's defaults: 30 s and 5 min). Not
    # lower: the check does not spare the scheduler running it, so a heartbeat late by more than the threshold on
    # a loaded host marks the live scheduler failed and resets its own running tasks (a CI run at 5 s went red, most
    # likely so: its logs were not kept, run_report now shows the tasks)
    live_env(airflow_setup, api_port, AIRFLOW__CORE__EXECUTOR="LocalExecutor",
             AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD="20",
             AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL="5")
    meta, results = airflow_setup.metadata_url, Path(airflow_setup.results_dir)
    af = AirflowProcesses(airflow_setup, tmp_path / "logs")
    run_id = RUN_ID
    try:
        api = af.start_components(api_port)
        trigger(api, "servetune_weekly", run_id, {"plans": ["restart.yaml"]})

        # mid-ramp: the ramp task is running and has finished at least one of its trials
        af.wait_until(lambda: task_states(meta, run_id).get(RAMP) == "running" and _ramp_trials(results) >= 1, 300)
        # the scheduler with its executor workers, task supervisors and the ramp's task process (a process
        # group of its own, which a kill of the scheduler's group would miss); the engine goes with its task
        engines = [p.pid for p in psutil.process_iter() if _owned(p)]
        killed = af.kill("scheduler")
        assert engines and len(killed) >= 3, (killed, engines)
        af.kill("dag-processor")
        af.kill("api")
        before = _outcomes(results)
        assert task_states(meta, run_id)[RAMP] == "running"  # what a crash leaves behind: an orphaned task

        af.start("scheduler", "scheduler")
        af.start("dag-processor", "dag-processor")
        # the new scheduler resets the orphan and runs it again while the API server is still down: that
        # attempt fails to reach it, and the retry's backoff outlasts the API server's start
        af.wait_until(lambda: task_states(meta, run_id)[RAMP] in ("up_for_retry", "scheduled", "queued"), 120)
        time.sleep(5)
        af.start("api", "api-server", "--port", str(api_port))
        state = wait_for_run(meta, run_id, timeout_s=480)
        assert state == "success", run_report(airflow_setup, run_id)[-12000:] + af.tails()[-3000:]
        # on the same LocalExecutor: a campaign whose engine dies at start is a red run
        # beside it a plan with a typo: its own prepare fails at once, the broken campaign still runs to its verdict
        typo = "name: typo\nmodel: m\nsla: {p99_ttft_ms: 500}\nstagess: {}\n"  # a misspelt section
        (airflow_setup.plans_dir / "typo.yaml").write_text(typo)
        trigger(api, "servetune_weekly", "manual__broken", {"plans": ["broken.yaml", "typo.yaml"]})
        assert wait_for_run(meta, "manual__broken", timeout_s=300) == "failed", af.tails()[-6000:]
        # a run marked failed over REST mid-ramp stays red: Airflow fails the running task, skips the rest
        # (outcome too) and runs the teardown, which finds the campaign unconcluded and fails the run
        trigger(api, "servetune_weekly", STOPPED, {"plans": ["restart.yaml"]})
        af.wait_until(lambda: task_states(meta, STOPPED).get(RAMP) == "running", 300)
        rest(f"{api}/dags/servetune_weekly/dagRuns/{STOPPED}", {"state": "failed"}, "PATCH")
        stopped = _settled(meta, STOPPED, af)
        assert stopped == "failed", run_report(airflow_setup, STOPPED) + af.tails()[-3000:]
    finally:
        af.stop_all()

    with psycopg.connect(localdb.libpq_dsn(meta)) as conn:
        tries = conn.execute("select try_number from task_instance where run_id = %s and task_id = %s",
                             (run_id, RAMP)).fetchone()[0]
    assert tries >= 2  # the ramp ran again after the crash, as a new attempt
    after = _outcomes(results)
    # every trial finished before the crash is kept as it was, and none was run twice
    assert all(after.get(tid) == key for tid, key in before.items()), (before, after)
    keys = list(after.values())
    assert len(keys) == len(set(keys)), keys
    assert sum(1 for k in keys if k[0] == "ramp") >= 4  # the ramp reached its last level after the restart
    exps = {e["dag_run_id"]: e for e in (json.loads(p.read_text()) for p in results.glob("*/experiment.json"))}
    assert exps[run_id]["status"] == "done", exps[run_id].get("status_reason")
    with psycopg.connect(localdb.libpq_dsn(airflow_setup.warehouse_url)) as conn:
        stored = [r[0] for r in conn.execute("select trial_id from trials join experiments using (experiment_id)"
                                             " where dag_run_id = %s", (run_id,))]
    assert sorted(stored) == sorted(after), (stored, list(after))  # no half-done trial of the killed attempt
    # no engine outlives its campaign: the last run's teardown may still be reaping one when the components stop
    # (on a busy host its SIGTERM grace runs out seconds later), so the check waits for them, bounded
    deadline, left = time.monotonic() + 60, []
    while time.monotonic() < deadline:
        left = [p for p in psutil.process_iter() if _owned(p) and _running(p)]
        if not left:
            break
        time.sleep(1)
    assert not left, [(p.pid, _cmd(p)) for p in left]
    logs = airflow_setup.home / "logs" / "dag_id=servetune_weekly"
    ramp = "".join(p.read_text() for p in logs.glob(f"run_id={run_id}/task_id={RAMP}/map_index=*/attempt=*.log"))
    assert all(f" ramp        level {c:>4}  goodput" in ramp for c in (4, 6, 8, 10)), ramp[-3000:]  # a line a trial
    with psycopg.connect(localdb.libpq_dsn(meta)) as conn:
        broken = {(t, m): (st, n) for t, m, st, n in conn.execute(
            "select task_id, rendered_map_index, state, try_number from task_instance where run_id = %s",
            ("manual__broken",))}
    assert broken[("campaign_local.prepare", "typo")] == ("failed", 1), broken  # at once, never retried
    assert broken[("campaign_local.outcome", "broken")][0] == "failed", broken
    assert broken[("campaign_local.report", "broken")][0] == "success", broken
    prepared = [p.read_text() for p in logs.glob("run_id=manual__broken/task_id=campaign_local.prepare/*/*.log")]
    assert sum("stagess" in text for text in prepared) == 1, prepared  # the field, in the bad plan's own log
    outcomes = "".join(p.read_text() for p in logs.glob("run_id=manual__broken/task_id=campaign_local.outcome/*/*.log"))
    bad = exps["manual__broken"]
    assert bad["status"] == "failed" and f"campaign broken failed: {bad['status_reason']}" in outcomes
    cut = exps[STOPPED]
    reason = "the DAG run was marked failed before the campaign concluded"
    assert cut["status"] == "failed" and cut["status_reason"] == reason, cut  # the last write: the stage task's
    states = task_states(meta, STOPPED)                                        # lock was waited for
    assert states[TEARDOWN] == "failed" and states["campaign_local.outcome"] == "skipped", states
    (teardown,) = logs.glob(f"run_id={STOPPED}/task_id={TEARDOWN}/map_index=*/attempt=*.log")  # no retry
    assert "the DAG run was marked failed before its verdict (campaign failed" in teardown.read_text()


def _settled(meta: str, run_id: str, af: AirflowProcesses) -> str | None:
    """The run's state once its teardown has ended and the scheduler has looked at the run since (its end date
    after the teardown's); bounded, since a run left as the PATCH set it is settled too."""
    af.wait_until(lambda: task_states(meta, run_id).get(TEARDOWN) in ("success", "failed"), 300)
    deadline = time.monotonic() + 60
    while True:
        with psycopg.connect(localdb.libpq_dsn(meta)) as conn:
            state, run_end, td_end = conn.execute(
                "select r.state, r.end_date, t.end_date from dag_run r join task_instance t using (run_id)"
                " where r.run_id = %s and t.task_id = %s", (run_id, TEARDOWN)).fetchone()
        if (run_end is not None and td_end is not None and run_end >= td_end) or time.monotonic() > deadline:
            return state
        time.sleep(1)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cmd(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:300]
    except psutil.Error:
        return "(gone)"


def _owned(proc: psutil.Process) -> bool:
    """An engine a campaign started (servetune.runners.sweep tags it)."""
    try:
        return OWNER_ENV in proc.environ()
    except psutil.Error:
        return False


def _outcomes(results: Path, run_id: str = RUN_ID) -> dict[str, tuple]:
    """trial id -> what the trial measured (stage, level, flags, size, seed), from the run's campaign state."""
    found = {}
    for exp in results.glob("*/experiment.json"):
        state = exp.with_name("state.json")
        if json.loads(exp.read_text()).get("dag_run_id") != run_id or not state.is_file():
            continue
        for o in json.loads(state.read_text()).get("outcomes", []):
            found[o["trial_id"]] = (o["stage"], o.get("concurrency"), o.get("rate"),
                                    json.dumps(o.get("flags"), sort_keys=True), o.get("requests"),
                                    o.get("warmup"), o.get("seed_offset"))
    return found


def _ramp_trials(results: Path) -> int:
    return sum(1 for key in _outcomes(results).values() if key[0] == "ramp")
