"""One writer per campaign folder: a second process waits for the holder or is refused with who holds it,
and a holder that dies (SIGKILL, as in an Airflow restart) leaves the folder free at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from airflow_fixtures import write_plan
from servetune.campaign_lock import CampaignBusy, campaign_lock
from servetune.cli import app

HOLD = ("import sys, time\nfrom servetune.campaign_lock import campaign_lock\n"
        "with campaign_lock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(float(sys.argv[2]))\n")


# holds the lock until told to let go (a line on stdin)
HOLD_UNTIL_TOLD = ("import sys\nfrom servetune.campaign_lock import campaign_lock\n"
                   "with campaign_lock(sys.argv[1]):\n    print('held', flush=True)\n    sys.stdin.readline()\n")


def _holder(folder, seconds: float) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_held_folder_is_refused_with_its_holder_and_freed_by_its_death(tmp_path):
    p = _holder(tmp_path, 60)
    try:
        with pytest.raises(CampaignBusy, match=f"pid {p.pid} on .* is running this campaign"):
            with campaign_lock(tmp_path, wait_s=0.3, poll_s=0.1):
                pass
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    with campaign_lock(tmp_path):  # no stale lock: the kernel dropped it with the process
        assert f"pid {os.getpid()} " in (tmp_path / ".campaign.lock").read_text()


def test_a_waiting_attempt_goes_on_once_the_holder_ends(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", HOLD_UNTIL_TOLD, str(tmp_path)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    told: list[str] = []

    def waiting(holder: str) -> None:  # the holder lets go only once this attempt is seen waiting
        told.append(holder)
        if len(told) == 1:
            p.stdin.write("go\n")
            p.stdin.flush()

    try:
        assert p.stdout.readline().strip() == "held"
        with campaign_lock(tmp_path, wait_s=120, poll_s=0.05, on_wait=waiting):
            assert f"pid {os.getpid()} " in (tmp_path / ".campaign.lock").read_text()
        assert p.wait(timeout=60) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert told and told[0].startswith(f"pid {p.pid} "), told


def test_tune_resume_on_a_folder_in_use_says_so_in_one_line(tmp_path):
    plan = write_plan(tmp_path / "plans")
    out = tmp_path / "run"
    first = CliRunner().invoke(app, ["tune", str(plan), "--out", str(out), "--virtual"])
    assert first.exit_code == 0, first.output
    p = _holder(out, 60)
    try:
        res = CliRunner().invoke(app, ["tune", str(plan), "--out", str(out), "--virtual", "--resume"])
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    assert res.exit_code == 2, res.output
    assert f"error: --resume: {out}: pid {p.pid} on" in res.output and "is running this campaign" in res.output
