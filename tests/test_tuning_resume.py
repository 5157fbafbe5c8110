"""A campaign stopped between trials (``--stop-after``) or by a signal goes on with ``--resume``
and ends where an uninterrupted one ends; ``--out`` is never reused by accident.

Virtual-time campaigns are deterministic, so a paused-and-resumed one must match a straight run
trial for trial. The signal test runs a live campaign against the simulated engine process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from airflow_fixtures import write_plan
from servetune.cli import app
from test_tuning_live import gone

PLANS = Path(__file__).resolve().parents[1] / "plans"
PAUSED, BAD_INPUT, INTERRUPTED = 75, 2, 130


def trials(out: Path) -> list[tuple]:
    state = json.loads((out / "state.json").read_text())
    return [(o["stage"], o["concurrency"], json.dumps(o["flags"], sort_keys=True), o["requests"],
             round(o["summary"].get("goodput_rps") or 0, 9)) for o in state["outcomes"]]


def tune(*args: str):
    return CliRunner().invoke(app, ["tune", *args])


def test_a_paused_campaign_resumes_to_the_same_answer(tmp_path: Path) -> None:
    plan = str(PLANS / "demo.yaml")  # about 5 GPU minutes of short trials: paused after each minute
    straight, stepped = tmp_path / "straight", tmp_path / "stepped"
    assert tune(plan, "--virtual", "--out", str(straight)).exit_code == 0
    res = tune(plan, "--virtual", "--out", str(stepped), "--stop-after", "1")
    assert res.exit_code == PAUSED, res.output
    assert "--resume" in res.output
    experiment = json.loads((stepped / "experiment.json").read_text())
    assert experiment["status"] == "paused" and experiment["recommendation"] is None
    calls, first_id = 1, experiment["experiment_id"]
    while res.exit_code == PAUSED:
        before = len(trials(stepped))
        res = tune(plan, "--virtual", "--out", str(stepped), "--resume", "--stop-after", "1")
        calls += 1
        assert len(trials(stepped)) > before, "a resumed call must make progress"
        assert calls < 40
    assert res.exit_code == 0, res.output
    assert calls > 3  # it really was cut into pieces
    assert trials(stepped) == trials(straight)
    a, b = (json.loads((d / "recommendation.json").read_text()) for d in (straight, stepped))
    assert (a["config"], a["concurrency"], a["goodput_rps"]) == (b["config"], b["concurrency"], b["goodput_rps"])
    experiment = json.loads((stepped / "experiment.json").read_text())
    assert experiment["status"] == "done" and experiment["experiment_id"] == first_id
    assert len(list((stepped / "trials").glob("*.json"))) == len(trials(stepped))


def test_out_is_never_reused_by_accident(tmp_path: Path) -> None:
    plan, out = str(PLANS / "demo.yaml"), tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    res = tune(plan, "--virtual", "--out", str(out))
    assert res.exit_code == BAD_INPUT and "not an empty folder" in res.output and "--resume" in res.output
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    res = tune(plan, "--virtual", "--resume")
    assert res.exit_code == BAD_INPUT and "--resume needs --out" in res.output
    res = tune(plan, "--virtual", "--out", str(out), "--resume")
    assert res.exit_code == BAD_INPUT and "experiment.json" in res.output


@pytest.mark.parametrize("where", ["loop", "loop/campaign", "dangling/campaign", "a-file/campaign"])
def test_an_out_folder_that_cannot_be_made_is_refused_before_the_first_trial(where: str, tmp_path: Path) -> None:
    (tmp_path / "loop").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "a-file").write_text("x")
    expect = {"loop": f"{tmp_path / 'loop'} is a symlink loop", "dangling": f"{tmp_path / 'dangling'} is a symlink"
              " to nowhere", "a-file": f"{tmp_path / 'a-file'} is not a folder"}[where.split("/")[0]]
    res = tune(str(PLANS / "demo.yaml"), "--virtual", "--out", str(tmp_path / where))
    assert res.exit_code == BAD_INPUT and f"--out: {expect}" in res.output, res.output
    assert not (tmp_path / "nowhere").exists()


def test_resume_refuses_another_plan_and_a_finished_campaign(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert tune(str(PLANS / "demo.yaml"), "--virtual", "--out", str(out), "--stop-after", "1").exit_code == PAUSED
    res = tune(str(PLANS / "8b-chat.yaml"), "--virtual", "--out", str(out), "--resume")
    assert res.exit_code == BAD_INPUT and "started with another plan" in res.output
    assert tune(str(PLANS / "demo.yaml"), "--virtual", "--out", str(out), "--resume").exit_code == 0
    res = tune(str(PLANS / "demo.yaml"), "--virtual", "--out", str(out), "--resume")
    assert res.exit_code == BAD_INPUT and "done already" in res.output


def test_a_plan_that_leaves_repeats_unset_resumes_with_the_command_it_prints(tmp_path: Path) -> None:
    """The campaign stores its plan with ``repeats.count`` resolved for its runner; a resume compares the plan
    the same way (it once refused every such plan as 'another plan'), and the printed command keeps
    ``--virtual``, so following it goes on in virtual time instead of starting the engine."""
    plan = tmp_path / "plan.yaml"
    plan.write_text("name: unset-repeats\nmodel: m\nsla: {p99_ttft_ms: 500}\nengine: {kind: sim}\n"
                    "stages: {refine: {enabled: false}}\n")
    out = tmp_path / "out"
    res = tune(str(plan), "--virtual", "--out", str(out), "--stop-after", "1")
    assert res.exit_code == PAUSED, res.output
    command = " ".join(res.output.split()).split("go on with: servetune tune ")[1].split()
    assert command == [str(plan), "--out", str(out), "--resume", "--virtual"]
    before = len(trials(out))
    res = tune(*command, "--stop-after", "1")
    assert res.exit_code in (0, PAUSED), res.output
    assert len(trials(out)) > before


def test_resume_takes_a_raised_budget_and_nothing_else(tmp_path: Path) -> None:
    """A campaign that ran out of GPU time finishes with a larger budget; any other change is refused."""
    out, text = tmp_path / "out", (PLANS / "demo.yaml").read_text()
    assert "max_gpu_minutes: 30\n" in text and "p99_tpot_ms: 40\n" in text
    raised, other = tmp_path / "raised.yaml", tmp_path / "other.yaml"
    raised.write_text(text.replace("max_gpu_minutes: 30\n", "max_gpu_minutes: 45\n"))
    other.write_text(text.replace("max_gpu_minutes: 30\n", "max_gpu_minutes: 45\n")
                     .replace("p99_tpot_ms: 40\n", "p99_tpot_ms: 41\n"))
    assert tune(str(PLANS / "demo.yaml"), "--virtual", "--out", str(out), "--stop-after", "1").exit_code == PAUSED
    res = tune(str(other), "--virtual", "--out", str(out), "--resume")
    assert res.exit_code == BAD_INPUT and "only budget.max_gpu_minutes may change" in res.output
    assert tune(str(raised), "--virtual", "--out", str(out), "--resume").exit_code == 0
    experiment = json.loads((out / "experiment.json").read_text())
    assert experiment["status"] == "done" and experiment["plan"]["budget"]["max_gpu_minutes"] == 45


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


@pytest.mark.timeout(180)
def test_sigterm_tears_the_engine_down_and_the_campaign_resumes(tmp_path: Path) -> None:
    plan, out = write_plan(tmp_path / "plans"), tmp_path / "out"
    cmd = [sys.executable, "-m", "servetune", "tune", str(plan), "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline, engines = time.monotonic() + 90, set()
    while time.monotonic() < deadline and proc.poll() is None:
        state = out / "state.json"
        engines = descendants(proc.pid)
        if state.exists() and len(json.loads(state.read_text())["outcomes"]) >= 2 and engines:
            break
        time.sleep(0.2)
    assert proc.poll() is None and engines, "the campaign should be running with an engine"
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == INTERRUPTED, output
    assert "interrupted after" in output and "--resume" in output
    experiment = json.loads((out / "experiment.json").read_text())
    assert experiment["status"] == "interrupted"
    time.sleep(0.5)
    assert all(gone(p) for p in engines), f"orphans: {[p for p in engines if not gone(p)]}"
    done = len(json.loads((out / "state.json").read_text())["outcomes"])
    res = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert res.returncode == 0, res.stdout + res.stderr
    state = json.loads((out / "state.json").read_text())
    assert len(state["outcomes"]) > done
    assert json.loads((out / "experiment.json").read_text())["status"] == "done"
    assert (out / "recommendation.json").exists()


def test_a_resumed_campaign_keeps_secrets_out_of_its_state_and_still_matches_its_trials(tmp_path: Path) -> None:
    """state.json stores a secret flag as ***; on --resume the plan's value comes back, so no trial is
    measured twice and the relaunch gets the real key."""
    import yaml

    secret = "sk-resume-3c9f1e"
    plan = yaml.safe_load((PLANS / "demo.yaml").read_text())
    plan["engine"].setdefault("args", {})["api-key"] = secret
    path = tmp_path / "demo-key.yaml"
    path.write_text(yaml.safe_dump(plan))
    straight, stepped = tmp_path / "straight", tmp_path / "stepped"
    assert tune(str(path), "--virtual", "--out", str(straight)).exit_code == 0
    res = tune(str(path), "--virtual", "--out", str(stepped), "--stop-after", "1")
    while res.exit_code == PAUSED:
        assert secret not in (stepped / "state.json").read_text() and '"***"' in (stepped / "state.json").read_text()
        res = tune(str(path), "--virtual", "--out", str(stepped), "--resume", "--stop-after", "1")
    assert res.exit_code == 0, res.output
    assert trials(stepped) != [] and len(trials(stepped)) == len(trials(straight))
    assert all(secret not in p.read_text() for p in stepped.rglob("*.json"))
