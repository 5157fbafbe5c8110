"""The README's "campaign on your own SGLang GPU host" section shows only options that exist.

Its plan must load as a TuningPlan (SSH runner, and the local-runner variant it names), every SSH key
it lists must be a field of SSHRunnerConfig, ``servetune tune PLAN --dry-run`` must run on it without a
GPU, and its ``servetune serve ... --runner ssh`` line must validate (``--dry-run`` prints the ssh command).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from typer.testing import CliRunner

from servetune.cli import app
from servetune.plan import TuningPlan, load_plan
from servetune.runners.base import SSHRunnerConfig

README = Path(__file__).resolve().parents[1] / "README.md"
HEADING = "## A campaign on your own SGLang GPU host"


def _section() -> str:
    text = README.read_text()
    assert HEADING in text
    return text.split(HEADING, 1)[1].split("\n## ", 1)[0]


def _plan_text() -> str:
    blocks = re.findall(r"```yaml\n(.*?)```", _section(), re.S)
    assert len(blocks) == 1
    return blocks[0]


def test_the_readme_plan_loads_with_both_runners(tmp_path: Path) -> None:
    path = tmp_path / "my-gpu.yaml"
    path.write_text(_plan_text())
    plan = load_plan(path)
    assert plan.engine.kind == "sglang" and plan.runner.kind == "ssh"
    assert plan.runner.destination == "alice@gpu-01.example.com" and plan.runner.gpus == [0]
    assert plan.estimate is not None
    local = yaml.safe_load(_plan_text())
    assert "`runner: {kind: local, gpus: [0]}`" in _section()
    local["runner"] = {"kind": "local", "gpus": [0]}
    assert TuningPlan.model_validate(local).runner.kind == "local"


def test_every_ssh_key_the_readme_names_exists() -> None:
    line = next(x for x in _section().splitlines() if "Other SSH keys" in x)
    following = _section().split(line, 1)[1].split("\n3.", 1)[0]
    names = re.findall(r"`([a-z_]+)`", line + following)
    assert len(names) >= 5
    assert set(names) <= set(SSHRunnerConfig.model_fields), set(names) - set(SSHRunnerConfig.model_fields)


def test_dry_run_of_the_readme_plan(tmp_path: Path) -> None:
    path = tmp_path / "my-gpu.yaml"
    path.write_text(_plan_text())
    res = CliRunner().invoke(app, ["tune", str(path), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "estimating with the simulator: llama-3.1-8b on H100-80G" in res.output
    assert "estimated GPU time" in res.output and "simulated recommendation" in res.output


def test_the_readme_serve_line_validates() -> None:
    text = " ".join(_section().split())
    command = re.search(r"`(servetune serve --engine sglang [^`]+)`", text).group(1)
    argv = command.split()[1:] + ["--dry-run"]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0, res.output
    assert res.output.startswith("ssh -T -o BatchMode=yes") and "alice@gpu-01.example.com" in res.output
    assert "/opt/sglang/bin/python3 -m sglang.launch_server --model-path /models/Llama-3.1-8B-Instruct" in res.output
