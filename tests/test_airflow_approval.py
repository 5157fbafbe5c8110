"""An answer that needs a person waits for one, under a real api-server, scheduler and dag-processor
(LocalExecutor): the model's first answer is accepted by servetune and the approve task skips itself; a planted
regression makes the next run red and its approve task waits in ``awaiting_input``; Rejected over REST, nothing
is accepted and the run after it is still compared with the first answer and still red; Approved over REST (the
Required Actions form's answer), that answer is the baseline, with who and why kept. The run that waits for its
answer overruns a one-minute GPU window and the DAG's deadline alert mails the notifiers."""

from __future__ import annotations

import json
import re
import urllib.request

import psycopg
import pytest
from sqlalchemy import create_engine, text

from airflow_procs import AirflowProcesses, free_port, live_env, rest, task_states, trigger, wait_for_run
from mail_sink import mail_sink
from servetune import localdb
from servetune.plan import load_plan
from servetune.warehouse.previous import last_accepted

pytestmark = pytest.mark.slow
APPROVE, OUTCOME = "campaign_local.approve", "campaign_local.outcome"


@pytest.mark.timeout(900)
def test_a_regression_waits_for_approval_over_rest_and_only_an_approved_answer_is_the_baseline(airflow_setup,
                                                                                                tmp_path):
    api_port = free_port()
    mails, smtp = mail_sink(airflow_setup)
    # a one-minute GPU window: the run that waits for its answer overruns it and the notifier hears it
    live_env(airflow_setup, api_port, AIRFLOW__CORE__EXECUTOR="LocalExecutor", SERVETUNE_GPU_WINDOW_MINUTES="1",
             AIRFLOW_VAR_SERVETUNE_NOTIFIERS=json.dumps([
                 {"notifier": "smtp", "args": {"to": "oncall@example.com", "from_email": "airflow@example.com"}}]))
    meta, wh = airflow_setup.metadata_url, airflow_setup.warehouse_url
    conf = {"plans": ["tiny.yaml"], "clock": "virtual"}
    af = AirflowProcesses(airflow_setup, tmp_path / "logs")
    try:
        api = af.start_components(api_port)

        # week 1: the model's first answer, accepted by servetune; nothing to ask
        trigger(api, "servetune_weekly", "week1", conf)
        assert wait_for_run(meta, "week1", timeout_s=300) == "success", af.tails()[-6000:]
        assert task_states(meta, "week1")[APPROVE] == "skipped"
        (first,) = _experiments(wh)
        with create_engine(wh).begin() as conn:  # the plant: week 1's goodput 50% higher
            conn.execute(text("update experiments set recommendation = jsonb_set(recommendation, '{goodput_rps}',"
                              " to_jsonb((recommendation->>'goodput_rps')::float * 1.5)) where experiment_id = :e"),
                         {"e": first})

        # week 2 regressed: red, and the question waits; Reject keeps week 1 as the baseline
        second = _run_to_the_question(af, api, meta, "week2", conf)
        # the deadline alert: the run still going a minute after it was queued, one mail (the scheduler's check)
        late = "week2: still running 1 min after it was queued: it overran its GPU window"
        af.wait_until(lambda: any(late in m["Subject"] for m in mails.messages), 180)
        assert sum(late in m["Subject"] for m in mails.messages) == 1  # once, beside the regression's own mail
        assert any("week2: campaign tiny-sim regressed" in m["Subject"] for m in mails.messages)
        detail = _get(_hitl(api, "week2"))
        assert second in detail["body"] and f"regressed against {first}: goodput_rps" in detail["body"], detail
        rest(_hitl(api, "week2"), {"chosen_options": ["Reject"], "params_input": {"why": "not yet"}}, "PATCH")
        assert wait_for_run(meta, "week2", timeout_s=120) == "failed"
        assert task_states(meta, "week2")[APPROVE] == "success" and task_states(meta, "week2")[OUTCOME] == "failed"
        assert _acceptances(wh) == {first: "servetune (automatic)"}

        # week 3: still compared with week 1, still red; Approved, it is the baseline
        third = _run_to_the_question(af, api, meta, "week3", conf)
        assert f"regressed against {first}" in _get(_hitl(api, "week3"))["body"]
        answered = rest(_hitl(api, "week3"), {"chosen_options": ["Approve"],
                                              "params_input": {"why": "new driver: slower is expected"}}, "PATCH")
        assert answered["chosen_options"] == ["Approve"]
        assert wait_for_run(meta, "week3", timeout_s=120) == "failed"  # the regression is still this run's verdict
        assert task_states(meta, "week3")[APPROVE] == "success"
    finally:
        af.stop_all()
        smtp.stop()
    accepted = _acceptances(wh, reasons=True)
    assert set(accepted) == {first, third} and second not in accepted
    who, why = accepted[third]
    assert who.endswith("(Airflow)") and why == "new driver: slower is expected"
    prev = last_accepted(load_plan(airflow_setup.plans_dir / "tiny.yaml"), wh)
    assert prev is not None and prev.experiment_id == third  # next week is compared with the approved answer


def _run_to_the_question(af: AirflowProcesses, api: str, meta: str, run_id: str, conf: dict) -> str:
    """Trigger ``run_id`` and wait until its approve task asks; the experiment it asks about."""
    trigger(api, "servetune_weekly", run_id, conf)
    af.wait_until(lambda: task_states(meta, run_id).get(APPROVE) == "awaiting_input"
                  and task_states(meta, run_id).get(OUTCOME) in ("success", "failed"), 300)
    assert task_states(meta, run_id)[OUTCOME] == "failed"  # red already: the question holds no verdict back
    # a person answers after the asking process has exited: the scheduler must have seen its exit first. An answer
    # within a second of the question raced it (Airflow 3.3.2 queued the resumption, then read the asking process's
    # late "success" against a queued task and failed the task)
    asked = re.compile(rf"TaskInstance Finished: dag_id=servetune_weekly, task_id={re.escape(APPROVE)},"
                       rf" run_id={re.escape(run_id)},.* state=awaiting_input")
    af.wait_until(lambda: asked.search(af.log("scheduler")), 60)
    with psycopg.connect(localdb.libpq_dsn(meta)) as conn:
        (value,) = conn.execute("select value from xcom where run_id = %s and task_id = 'campaign_local.load'"
                                " and key = 'return_value'",
                                (run_id,)).fetchone()
    loaded = value if isinstance(value, dict) else json.loads(value)
    assert loaded["awaits"] and loaded["accepted"] is None, loaded
    return loaded["experiment_id"]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def _hitl(api: str, run_id: str) -> str:
    return f"{api}/dags/servetune_weekly/dagRuns/{run_id}/taskInstances/{APPROVE}/0/hitlDetails"


def _experiments(wh: str) -> list[str]:
    with create_engine(wh).begin() as conn:
        return [r[0] for r in conn.execute(text("select experiment_id from experiments order by started_at"))]


def _acceptances(wh: str, reasons: bool = False) -> dict:
    with create_engine(wh).begin() as conn:
        rows = conn.execute(text("select experiment_id, accepted_by, reason from acceptances")).all()
    return {r[0]: (r[1], r[2]) if reasons else r[1] for r in rows}
