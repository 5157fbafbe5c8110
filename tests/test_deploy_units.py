"""deploy/systemd: the three Airflow units verify with systemd's own checker and kill their whole control group
(a scheduler's orphaned LocalExecutor workers would otherwise hold the DAG run's row lock; docs/airflow.md)."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = sorted((Path(__file__).resolve().parents[1] / "deploy" / "systemd").glob("*.service"))


def _unit(path: Path) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(path.read_text())
    return cp


def test_there_is_a_unit_for_each_component_and_each_kills_its_control_group() -> None:
    assert {p.stem for p in UNITS} == {f"servetune-airflow-{c}" for c in ("api-server", "scheduler", "dag-processor")}
    for path in UNITS:
        svc = _unit(path)["Service"]
        assert svc["KillMode"] == "control-group" and svc["Restart"] == "always", path.name
        assert svc["ExecStart"].split()[1] == path.stem.removeprefix("servetune-airflow-"), svc["ExecStart"]
        assert svc["EnvironmentFile"] == "/etc/servetune/airflow.env"  # secrets stay out of the unit


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze on this machine")
def test_each_unit_verifies_with_systemd(tmp_path: Path) -> None:
    """`systemd-analyze verify` on a copy whose ExecStart names an executable that exists here (the units name
    the production venv's airflow) and whose EnvironmentFile is optional: any other complaint fails."""
    for path in UNITS:
        text = path.read_text().replace("/opt/servetune/.venv/bin/airflow", sys.executable) \
            .replace("EnvironmentFile=/", "EnvironmentFile=-/").replace("User=servetune", "User=root")
        copy = tmp_path / path.name
        copy.write_text(text)
        proc = subprocess.run(["systemd-analyze", "verify", "--man=no", str(copy)], capture_output=True, text=True,
                              timeout=60)
        # a bad value is only a warning line ("Failed to parse kill mode specification, ignoring"): none allowed
        assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc.stdout + proc.stderr
