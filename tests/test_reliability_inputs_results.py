"""Bad result files: ``servetune validate`` and ``servetune load`` refuse each with the same one line.

Both read through ``TrialResult.read`` (servetune.result_check): typed fields (pydantic, strict), required
sections named, the path of the bad field in the message. ``load`` runs against a real Postgres and must
leave no row of a refused trial; ``validate`` runs the real GX checklist on the good one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from servetune.cli import app
from servetune.warehouse import db
from warehouse_fixtures import make_trial, migrated, write_campaign

Mutation = Callable[[dict[str, Any]], Any]


def _set(section: str, key: str, value: Any) -> Mutation:
    return lambda d: d[section].__setitem__(key, value)


def _record(i: int, key: str, value: Any) -> Mutation:
    return lambda d: d["records"][i].__setitem__(key, value)


#: (case, change to a good result's JSON, the message after "PATH: ")
CASES: list[tuple[str, Mutation, str]] = [
    ("status", lambda d: d.__setitem__("status", "great"),
     "status: expected one of 'ok', 'failed' or 'rejected', got 'great'"),
    ("record-e2e", _record(3, "e2e_ms", "fast"), "records[3].e2e_ms: expected a number, got 'fast'"),
    ("record-id", _record(5, "request_id", "five"), "records[5].request_id: expected an integer, got 'five'"),
    ("record-warmup", _record(0, "warmup", "no"), "records[0].warmup: expected true or false, got 'no'"),
    ("record-chunks", _record(1, "chunk_tokens", [8, "eight"]),
     "records[1].chunk_tokens[1]: expected an integer, got 'eight'"),
    ("record-shape", lambda d: d["records"].__setitem__(2, [1, 2]), "records[2]: expected an object, got [1, 2]"),
    ("records-shape", lambda d: d.__setitem__("records", {"0": {}}), "records: expected a list, got {'0': {}}"),
    ("no-summary", lambda d: d.pop("summary"), "summary: required section missing"),
    ("no-records", lambda d: d.pop("records"), "records: required section missing"),
    ("no-trial-id", lambda d: d.pop("trial_id"), "trial_id: required field missing"),
    ("summary-valid", _set("summary", "valid", "yes"), "summary.valid: expected true or false, got 'yes'"),
    ("summary-count", _set("summary", "requests_total", "250"),
     "summary.requests_total: expected an integer, got '250'"),
    ("summary-unknown", _set("summary", "p99_of_everything", 1.0), "summary.p99_of_everything: unknown field"),
    ("percentile", lambda d: d["summary"]["ttft_ms"].__setitem__("p99", "slow"),
     "summary.ttft_ms.p99: expected a number, got 'slow'"),
    ("gpu-sample", lambda d: d["gpu"]["samples"][2].__setitem__("t_s", "later"),
     "gpu.samples[2].t_s: expected a number, got 'later'"),
    ("server-sample", lambda d: d["server"]["samples"][0].pop("name"),
     "server.samples[0].name: required field missing"),
    ("t0", lambda d: d.__setitem__("t0_unix", "yesterday"), "t0_unix: expected a number, got 'yesterday'"),
    ("target", lambda d: d.__setitem__("target", "http://u:hunter2hunter2@h:1"),
     "target: expected an object, got 'http://u:***@h:1'"),
    ("schema", lambda d: d.__setitem__("schema", "other/1"),
     "not a servetune trial result (schema='other/1', want 'servetune.trial/1')"),
]


@pytest.fixture(scope="module")
def url(database_url: str) -> str:
    return migrated(database_url)


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = make_trial(trial_id="good-0").save(tmp_path_factory.mktemp("good") / "good.json")
    return orjson.loads(path.read_bytes())


def _stored(url: str, trial_id: str) -> int:
    eng = db.engine(url)
    try:
        with eng.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM trials WHERE trial_id = :t"), {"t": trial_id}).scalar()
    finally:
        eng.dispose()


def _refusal(args: list[str]) -> str:
    """Run the command; it must exit 2 with exactly one stderr line and no traceback; return that line."""
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert isinstance(res.exception, SystemExit) and "Traceback" not in res.output, res.exception
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


@pytest.mark.parametrize(("case", "mutate", "message"), CASES, ids=[c[0] for c in CASES])
def test_validate_and_load_refuse_alike(case: str, mutate: Mutation, message: str, good: dict[str, Any],
                                        url: str, tmp_path: Path) -> None:
    data = orjson.loads(orjson.dumps(good))
    data["trial_id"] = f"bad-{case}"
    mutate(data)
    path = tmp_path / f"{case}.json"
    path.write_bytes(orjson.dumps(data))
    checked = _refusal(["validate", str(path)])
    loaded = _refusal(["load", str(path), "--database-url", url])
    assert checked == f"validate: {path}: {message}"
    assert loaded == f"load: {path}: {message}"
    assert _stored(url, f"bad-{case}") == 0  # refused before any row is written


@pytest.mark.parametrize(("content", "message"), [
    (b"{\"schema\": ", "not valid JSON (unexpected end of data at line 1)"),
    (b"[1, 2]", "a trial result must be a JSON object, got list"),
    (b"\xff\xfe", "not valid JSON"),
])
def test_files_that_are_no_result_at_all(content: bytes, message: str, url: str, tmp_path: Path) -> None:
    path = tmp_path / "odd.json"
    path.write_bytes(content)
    checked = _refusal(["validate", str(path)])
    loaded = _refusal(["load", str(path), "--database-url", url])
    assert checked.removeprefix("validate: ") == loaded.removeprefix("load: ")
    assert checked.startswith(f"validate: {path}: {message}")


@pytest.mark.parametrize(("where", "insert", "key"), [
    (b"{", b'{"trial_id":"other",', "trial_id"),  # two documents' heads joined
    (b'"summary":{', b'"summary":{"requests_ok":99999,', "requests_ok"),  # a hand edit beside the real one
    (b'"records":[{', b'"records":[{"e2e_ms":1.0,', "e2e_ms"),  # in the first record
])
def test_a_key_given_twice_is_refused_by_every_reader(where: bytes, insert: bytes, key: str,
                                                     good: dict[str, Any], url: str, tmp_path: Path) -> None:
    path = tmp_path / "twice.json"
    text = orjson.dumps({**good, "trial_id": "dup-0"})
    assert where in text
    path.write_bytes(text.replace(where, insert, 1))
    checked = _refusal(["validate", str(path)])
    loaded = _refusal(["load", str(path), "--database-url", url])
    assert checked == f"validate: {path}: key {key!r} is given twice in one object (the last would silently win;" \
                      " servetune writes each key once: a hand edit or two files joined?)"
    assert loaded == checked.replace("validate: ", "load: ", 1)
    assert _stored(url, "dup-0") == 0


def test_the_good_result_passes_both(good: dict[str, Any], url: str, tmp_path: Path) -> None:
    """The control: the same file unchanged is accepted by the checklist and stored."""
    path = tmp_path / "good.json"
    path.write_bytes(orjson.dumps(good))
    res = CliRunner().invoke(app, ["validate", str(path)])
    assert res.exit_code == 0 and "ACCEPTED" in res.output, res.output
    res = CliRunner().invoke(app, ["load", str(path), "--database-url", url])
    assert res.exit_code == 0 and "inserted" in res.output, res.output
    assert _stored(url, "good-0") == 1


def test_a_bad_trial_in_a_campaign_is_named_and_the_rest_load(url: str, tmp_path: Path) -> None:
    """In a campaign folder the bad file gets the same line; the good trials beside it are stored."""
    exp = {"experiment_id": "exp-bad-inputs", "model": "llama-8b", "trigger": "manual"}
    ok = make_trial(trial_id="camp-ok", experiment_id="exp-bad-inputs")
    broken = make_trial(trial_id="camp-bad", experiment_id="exp-bad-inputs")
    folder = write_campaign(tmp_path / "camp", exp, [ok, broken])
    bad_file = folder / "trials" / "camp-bad.json"
    data = orjson.loads(bad_file.read_bytes())
    data["records"][7]["ttft_ms"] = "soon"
    bad_file.write_bytes(orjson.dumps(data))
    expected = f"{bad_file}: records[7].ttft_ms: expected a number, got 'soon'"
    res = CliRunner().invoke(app, ["load", str(folder), "--database-url", url])
    assert res.exit_code == 1, res.output
    assert res.stderr.strip().splitlines() == [f"load: {expected}"]
    assert _stored(url, "camp-ok") == 1 and _stored(url, "camp-bad") == 0
    assert _refusal(["validate", str(bad_file)]) == f"validate: {expected}"
