"""The baseline a run is compared with is the last accepted answer (servetune.warehouse.acceptance): the
model's first answer and one that changed nothing and fell behind in nothing are accepted by servetune; a
regressed or changed answer waits for `servetune accept`, and until then later runs compare with the accepted
one. Real PostgreSQL, the real loader and CLI."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
from sqlalchemy import text
from typer.testing import CliRunner

from report_fixtures import write_campaign
from servetune.cli import app
from servetune.ingest import load_result
from servetune.plan import parse_plan
from servetune.report.history import fetch_history
from servetune.warehouse import db, migrate, queries
from servetune.warehouse.acceptance import awaiting
from servetune.warehouse.previous import last_accepted

MODEL = "llama-3.1-8b"
START = datetime(2026, 10, 5, 3, 0, tzinfo=UTC)


def _campaign(root: Path, week: int, *, against: str | None = None, regressed: bool = False,
              same_config: bool = True) -> Path:
    d = write_campaign(root, model=MODEL, started=START + timedelta(weeks=week))
    data = orjson.loads((d / "experiment.json").read_bytes())
    data["status"] = "done"  # as a campaign writes it
    if against is not None:
        level = data["recommendation"]["concurrency"]
        data["recommendation"]["diff_from_previous"] = {
            "against": {"experiment_id": against}, "same_config": same_config,
            "config": {} if same_config else {"chunked-prefill-size": {"old": None, "new": 4096}},
            "figures": {"concurrency": {"old": level, "new": level}, "rate": {"old": None, "new": None}},
            "regressions": [{"figure": "goodput_rps", "why": "goodput 4.2 -> 3.1 req/s (-26%)"}] if regressed else []}
    (d / "experiment.json").write_bytes(orjson.dumps(data))
    return d


def _accepted(url: str) -> dict[str, tuple[str, bool]]:
    eng = db.engine(url)
    try:
        with eng.connect() as conn:
            return {r[0]: (r[1], r[2]) for r in conn.execute(
                text("select experiment_id, reason, automatic from acceptances")).all()}
    finally:
        eng.dispose()


def test_a_regression_stays_the_comparison_until_someone_accepts_it(fresh_database_url: str, tmp_path: Path) -> None:
    url = fresh_database_url
    migrate.upgrade(url)
    plan = parse_plan({"name": "llama-chat", "model": MODEL, "sla": {"p99_ttft_ms": 800}})
    first = load_result(url, _campaign(tmp_path, 0), validate=False)
    assert first.accepted == f"the first answer for {MODEL}"
    a = first.experiment_id
    slow_dir = _campaign(tmp_path, 1, against=a, regressed=True)
    slow = load_result(url, slow_dir, validate=False)
    assert slow.ok and slow.accepted is None  # a regression waits for a person
    assert {e.experiment_id: e.shown_status() for e in fetch_history(MODEL, database_url=url)}[
        slow.experiment_id] == "regressed"
    assert last_accepted(plan, url).experiment_id == a  # next week is compared with the accepted answer
    changed = load_result(url, _campaign(tmp_path, 2, against=a, same_config=False), validate=False)
    assert changed.accepted is None  # another config, even a faster one, waits too
    same = load_result(url, _campaign(tmp_path, 3, against=a), validate=False)
    assert same.accepted.startswith("the same config and level as " + a)
    assert last_accepted(plan, url).experiment_id == same.experiment_id
    # a reload of the regressed campaign's folder never accepts it
    assert load_result(url, slow_dir, validate=False).accepted is None

    r = CliRunner().invoke(app, ["accept", slow.experiment_id[:12], "--why", "the new driver is slower; known",
                                 "--by", "alice", "--database-url", url])
    assert r.exit_code == 0, r.output
    assert f"accepted {slow.experiment_id} ({MODEL}) as the baseline, by alice" in r.output
    assert _accepted(url)[slow.experiment_id] == ("the new driver is slower; known", False)
    assert set(_accepted(url)) == {a, same.experiment_id, slow.experiment_id}
    # the newest accepted answer is the baseline: `same` (week 3) is newer than the regressed week 1
    assert last_accepted(plan, url).experiment_id == same.experiment_id

    # `history` says which answer is the baseline and which await a person
    shown = {e.experiment_id: e.shown_status() for e in fetch_history(MODEL, database_url=url)}
    assert shown == {a: "done ✓", slow.experiment_id: "done ✓", changed.experiment_id: "awaiting",
                     same.experiment_id: "done ✓"}

    # the named queries an operator reads: the regression and who accepted it, every answer and its decision
    cols, rows = queries.run("regressions", {"days": "3650"}, database_url=url)
    got = [dict(zip(cols, r, strict=True)) for r in rows]
    assert [(g["experiment_id"], g["against_experiment_id"], g["accepted_by"]) for g in got] == [
        (slow.experiment_id, a, "alice")]
    cols, rows = queries.run("accepted_answers", {}, database_url=url)
    by = {r[cols.index("experiment_id")]: r[cols.index("accepted_by")] for r in rows}
    assert by == {a: "servetune (automatic)", slow.experiment_id: "alice", changed.experiment_id: None,
                  same.experiment_id: "servetune (automatic)"}


def test_accept_refuses_what_cannot_be_a_baseline_in_one_line(fresh_database_url: str, tmp_path: Path) -> None:
    url = fresh_database_url
    migrate.upgrade(url)
    d = _campaign(tmp_path, 0)
    data = orjson.loads((d / "experiment.json").read_bytes())
    data.update(status="failed", recommendation=None)
    (d / "experiment.json").write_bytes(orjson.dumps(data))
    failed = load_result(url, d, validate=False)
    assert failed.accepted is None
    cols, rows = queries.run("failed_campaigns", {"days": "3650"}, database_url=url)
    assert [r[cols.index("experiment_id")] for r in rows] == [failed.experiment_id]
    for argv, words in (([failed.experiment_id, "--why", "x"], "is failed with no recommendation"),
                        (["0" * 32, "--why", "x"], "no experiment"),
                        ([failed.experiment_id, "--why", "  "], "say why")):
        r = CliRunner().invoke(app, ["accept", *argv, "--database-url", url])
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert r.exit_code == 2 and len(lines) == 1 and words in lines[0], r.output


def test_why_an_answer_awaits_a_person_is_one_line_naming_what_moved() -> None:
    against = {"experiment_id": "abc123"}
    regressed = {"diff_from_previous": {"against": against, "same_config": True,
                                        "regressions": [{"why": "goodput_rps 10 -> 6.7 (-33.0%)"}]}}
    assert awaiting("done", regressed) == "it regressed against abc123: goodput_rps 10 -> 6.7 (-33.0%)"
    flags = {"diff_from_previous": {"against": against, "same_config": False, "regressions": [],
                                    "config": {"chunked-prefill-size": {"old": 8192, "new": 4096}}}}
    assert awaiting("done", flags) == "its flags differ from abc123's: --chunked-prefill-size 8192 -> 4096"
    level = {"diff_from_previous": {"against": against, "same_config": True, "regressions": [],
                                    "figures": {"concurrency": {"old": 32, "new": 48}}}}
    assert awaiting("done", level) == "its concurrency differs from abc123's"
    assert awaiting("failed", regressed) is None and awaiting("done", None) is None
