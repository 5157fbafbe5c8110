"""A plan whose engine is launched with an API key: the load generator sends that key (read from the plan at run
time, through an environment variable only its name of which is recorded), so live trials are not all 401s, and
the key appears in no result file, log line or console output."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_fixtures import TINY_PLAN
from servetune.engines.base import parse_engine_config
from servetune.plan import parse_plan
from servetune.tuning.live import ENGINE_KEY_ENV, LiveTrialRunner, engine_api_key
from servetune.tuning.state import TrialSpec

KEY = "sk-engineKEY-9f3c1d"


@pytest.mark.parametrize(("engine", "key"), [
    ({"kind": "sim", "args": {"api-key": KEY}}, KEY),
    ({"kind": "sglang", "model": "/m", "args": {"api-key": KEY}}, KEY),
    ({"kind": "vllm", "model": "/m", "env": {"VLLM_API_KEY": KEY}}, KEY),
    ({"kind": "vllm", "model": "/m", "extra_args": ["--api-key", KEY]}, KEY),
    ({"kind": "sim"}, None),
    ({"kind": "external", "url": "http://127.0.0.1:9"}, None),  # a server we only measure: the user's key
])
def test_the_engines_key_is_found_where_the_plan_puts_it(engine, key) -> None:
    assert engine_api_key(parse_engine_config(engine)) == key


def test_a_live_trial_against_an_engine_with_a_key_sends_it(tmp_path: Path, monkeypatch, caplog) -> None:
    for name in ("SERVETUNE_API_KEY", "OPENAI_API_KEY", ENGINE_KEY_ENV):
        monkeypatch.delenv(name, raising=False)
    plan = parse_plan({**TINY_PLAN, "engine": {**TINY_PLAN["engine"], "args": {"api-key": KEY}}})
    runner = LiveTrialRunner(plan, log_dir=tmp_path / "logs")
    try:
        spec = TrialSpec(stage="baseline", concurrency=2, flags=plan.engine_flags(), requests=12, warmup=2)
        report = runner.run(spec, experiment_id="key")
    finally:
        runner.close()
    result = report.result
    assert result.status != "failed", result.failure_reason
    assert all(r.http_status == 200 for r in result.records)  # without the key: 401 on every request
    saved = tmp_path / "trial.json"
    result.save(saved)
    assert KEY not in saved.read_text() and KEY not in caplog.text
    assert result.target["api_key_env"] == ENGINE_KEY_ENV  # the variable's name, never its value
    assert os.environ[ENGINE_KEY_ENV] == KEY
