"""Every bad input of bench/bad_inputs.py gets its one clear line: exit code, no traceback, no secret.

Why in-process: ~140 interpreter starts would cost minutes on two cores; typer's CliRunner runs the same
root group (servetune.cli.OneLineErrors) in milliseconds. A few cases also run as real
``python -m servetune`` processes, so the entry point itself is covered.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import bad_inputs  # noqa: E402
import bad_inputs_boundary as boundary  # noqa: E402
from bad_inputs import CASES, SECRET, Case, Outcome, prepare, problems, run_subprocess  # noqa: E402
from servetune.cli import app  # noqa: E402
from warehouse_fixtures import migrated  # noqa: E402

COMMANDS = {"tune", "bench", "validate", "load", "db", "query", "history", "report", "serve", "sim"}


def _timed_out(signum: int, frame: Any) -> None:
    raise TimeoutError("the case ran past its time limit (did it start something?)")


def run_inprocess(case: Case, where: Path, db: str | dict[str, str] | None, timeout: float = 30.0) -> Outcome:
    """The case through CliRunner in ``where``, with the catalogue's environment; an escaped exception
    counts as the traceback a user would have seen."""
    argv = prepare(case, where, db)
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith(("SERVETUNE_", "AIRFLOW_CONN_"))}
    env.update(COLUMNS="80", NO_COLOR="1")
    cwd, alarm = Path.cwd(), threading.current_thread() is threading.main_thread()
    os.chdir(where)
    if alarm:  # a case that starts a server by mistake must fail, not hang the suite
        old = signal.signal(signal.SIGALRM, _timed_out)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        r = CliRunner().invoke(app, argv, env=env)
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        os.chdir(cwd)
    err = r.stderr
    if r.exc_info is not None and not isinstance(r.exception, SystemExit):
        err += "".join(traceback.format_exception(*r.exc_info))
    return Outcome(r.exit_code, r.stdout, err)


@pytest.fixture(scope="module")
def db(database_url: str) -> str:
    return migrated(database_url)


@pytest.fixture(scope="module")
def places(pg_server_url: str, db: str) -> Iterator[dict[str, str]]:
    """The boundary cases' databases (ahead, behind, foreign, ...) and ports (a web server, a silent one)."""
    with boundary.places(pg_server_url, db) as filled:
        yield filled


def test_the_catalogue_covers_every_command_with_60_cases_or_more() -> None:
    assert len(CASES) >= 60
    assert len({c.name for c in CASES}) == len(CASES)
    assert {c.argv[0] for c in CASES} >= COMMANDS
    assert all(c.expect for c in CASES), "every case names the words its message must hold"
    known = [c for c in CASES if c.known]
    assert len(known) <= 8 and all(c.known.startswith("servetune/") for c in known), "each names its owner file"


def test_the_rules_can_fail() -> None:
    case = Case("x", ["bench"], ("--url",))
    assert problems(case, Outcome(2, "", "error: --url: not a URL\n")) == []
    assert problems(case, Outcome(1, "", "error: --url: no\n")) == ["exit 1, expected 2"]
    assert "2 lines, expected 1" in problems(case, Outcome(2, "", "error: --url is\nwrapped\n"))
    assert "traceback" in problems(case, Outcome(2, "", "error: --url\nTraceback (most recent call last):\n"))
    assert "does not name '--url'" in problems(case, Outcome(2, "", "error: something is wrong\n"))
    assert "secret shown" in problems(case, Outcome(2, "", f"error: --url http://u:{SECRET}@h\n"))
    log = "2026-01-01 10:00:00,000 INFO servetune: starting\nerror: --url: bad\n"
    assert problems(case, Outcome(2, "", log)) == []  # a log record is not part of the message


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=[pytest.mark.xfail(strict=True, reason=c.known)]
                                               if c.known else []) for c in CASES])
def test_each_bad_input_gets_its_clear_line(case: Case, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    wanted = boundary.needs(case.argv)
    db = request.getfixturevalue("places" if wanted - {"db"} else "db") if wanted else None
    out = run_inprocess(case, tmp_path, db)
    assert problems(case, out) == [], f"{out.message()}\n{out.stderr[-3000:]}"


@pytest.mark.parametrize("name", ["plan_not_utf8", "bench_concurrency_text", "sim_unknown_flag", "unknown_command"])
def test_the_real_entry_point_answers_the_same(name: str, tmp_path: Path) -> None:
    case = next(c for c in CASES if c.name == name)
    out = run_subprocess(case, tmp_path)
    assert problems(case, out) == [], out.stderr
    assert out.message() == run_inprocess(case, tmp_path / "again", None).message()


def _boom(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError(f"boom at postgresql://u:{SECRET}@h/db\nsecond line")


def test_an_unexpected_error_is_one_line_and_its_traceback_needs_v(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    import servetune.report.history

    monkeypatch.setattr(servetune.report.history, "fetch_history", _boom)
    case = Case("boom", ["history", "--model", "m", "--database-url", "postgresql://x@127.0.0.1/db"], ("boom",), code=1)
    out = run_inprocess(case, tmp_path, None)
    assert out.message() == ["error: RuntimeError: boom at postgresql://u:***@h/db (unexpected: run with -v for the"
                             " traceback)"]
    assert problems(case, out) == []
    verbose = run_inprocess(Case("boom", ["-v", *case.argv], ("boom",), code=1), tmp_path / "v", None)
    assert verbose.code == 1 and bad_inputs.TRACEBACK in verbose.stderr and "_boom" in verbose.stderr
    assert verbose.stderr.rstrip().splitlines()[-1] == out.message()[0]
