"""Readable output (issue 20): library logs quiet unless ``-v``; ``--json`` puts one document on stdout.

``servetune validate`` runs as a real subprocess on the real H200 trial kept in tests/data (Great
Expectations logs dozens of INFO lines while it imports); the other commands run in-process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import orjson
from typer.testing import CliRunner

from servetune.checklist_report import PLAIN
from servetune.cli import app
from servetune.logs import Policy, quiet_info, setup
from sse_server import Scenario
from test_trial import _serve

REPO = Path(__file__).resolve().parents[1]
H200_TRIAL = REPO / "tests" / "data" / "gpu-h200" / "bench-c32.json"


def test_validate_prints_only_its_verdict_table() -> None:
    proc = subprocess.run([sys.executable, "-m", "servetune", "validate", str(H200_TRIAL)], capture_output=True,
                          text=True, timeout=120, cwd=REPO, env={**os.environ, "COLUMNS": "140"})
    both = proc.stdout + proc.stderr
    assert proc.returncode == 1, both  # the trial is rejected (no hit rate: transformers reports no cached tokens)
    assert "great_expectations" not in both and " INFO " not in both, both[:2000]
    assert proc.stderr == "", proc.stderr  # nothing beside the table and its verdict line
    lines = proc.stdout.splitlines()
    assert "REJECTED (GX" in lines[0] and "┃ checklist" in proc.stdout
    assert "│ FAIL │ prefix_hit_rate" in proc.stdout
    assert lines[-2].startswith(f"rejected: {PLAIN['prefix_hit_rate']}")  # plain words, then the items as detail
    assert lines[-1].startswith("checklist items: prefix_hit_rate")


def _record(name: str, level: int) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, "m", (), None)


def test_policy_quiets_libraries_below_warning_unless_verbose() -> None:
    try:
        setup(verbose=False)
        policy = Policy()
        for lib in ("great_expectations._docs_decorators", "alembic.runtime.migration", "httpx", "urllib3",
                    "asyncio"):
            assert not policy.filter(_record(lib, logging.INFO)), lib
            assert policy.filter(_record(lib, logging.WARNING)), lib
        assert policy.filter(_record("servetune.runners.lifecycle", logging.INFO))  # our own progress stays
        assert not policy.filter(_record("servetune.runners.lifecycle", logging.DEBUG))
        assert not policy.filter(_record("py.warnings", logging.WARNING))
        quiet_info("servetune.validation")
        assert not policy.filter(_record("servetune.validation.checklist", logging.INFO))
        assert policy.filter(_record("servetune.validation.checklist", logging.WARNING))
        setup(verbose=True)
        assert policy.filter(_record("great_expectations.core", logging.DEBUG))
        assert policy.filter(_record("servetune.validation.checklist", logging.INFO))  # reset per invocation
    finally:
        setup(verbose=False)


def _json_run(*args: str) -> tuple[object, str, int]:
    res = CliRunner().invoke(app, ["--json", *args])
    return orjson.loads(res.stdout), res.stderr, res.exit_code


def test_json_validate_is_one_document() -> None:
    doc, err, code = _json_run("validate", str(H200_TRIAL))
    assert code == 1 and isinstance(doc, dict)
    assert doc["accepted"] is False and doc["report"]["success"] is False
    assert {"prefix_hit_rate"} <= {o["checklist"] for o in doc["report"]["results"] if not o["success"]}
    assert "REJECTED" in err  # the table moved to stderr


def test_json_tune_and_progress(tmp_path: Path) -> None:
    doc, err, code = _json_run("tune", str(REPO / "plans" / "demo.yaml"), "--virtual", "--out", str(tmp_path / "c"))
    assert code == 0, err
    assert doc["status"] == "done" and doc["trials"] >= 5 and doc["recommendation"]["concurrency"] > 0
    assert doc["experiment_id"] and Path(doc["out"]) == tmp_path / "c"
    assert "#1 of <= " in err and "ETA <= " in err  # trial n of N (an upper bound) and the ETA
    dry, err, code = _json_run("tune", str(REPO / "plans" / "demo.yaml"), "--dry-run")
    assert code == 0 and dry["simulated"] is True and len(dry["trials"]) >= 5 and dry["estimated_gpu_s"] > 0


def test_json_query_lists_the_queries() -> None:
    doc, _, code = _json_run("query")
    assert code == 0 and isinstance(doc, list)
    assert "ceiling_last_month" in {q["name"] for q in doc}


async def test_json_bench(tmp_path: Path) -> None:
    srv, _ = await _serve(Scenario(ttft_ms=10, gap_ms=2, tokens_per_chunk=2))
    wl = tmp_path / "tiny.yaml"
    wl.write_text("name: tiny\nseed: 3\ninput: {kind: fixed, value: 32}\noutput: {kind: fixed, value: 8}\n")
    try:
        res = await asyncio.to_thread(CliRunner().invoke, app, [
            "--json", "bench", "--url", srv.url, "--concurrency", "2", "--requests", "8", "--warmup", "1",
            "--out", str(tmp_path / "r.json"), "--workload", str(wl), "--model", "sse-test"])
    finally:
        await srv.stop()
    doc = orjson.loads(res.stdout)
    assert doc["status"] == "ok" and doc["summary"]["requests_ok"] == 8, res.stderr
    assert doc["result"] == str(tmp_path / "r.json") and "latency (ms)" in res.stderr
