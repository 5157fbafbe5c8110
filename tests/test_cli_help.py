"""Every subcommand's help as a new user reads it: each option and argument says what it is for, and
``--help`` answers for every command (issue 33). One convention for machine output: every command that
gives a result takes ``--json`` after its name, one JSON document on stdout and the human text on stderr."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import typer
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from report_fixtures import write_campaign
from servetune import __version__, localdb
from servetune.cli import app

REPO = Path(__file__).resolve().parents[1]
H200_TRIAL = REPO / "tests" / "data" / "gpu-h200" / "bench-c32.json"  # a real trial, rejected (no hit rate)
TRACES = REPO / "tests" / "data" / "traces"
MODEL = "cli-json-8b"


def commands() -> list[tuple[list[str], object]]:
    """(path, command) for the root, every group and every command under it."""
    out: list[tuple[list[str], object]] = []

    def walk(cmd: object, path: list[str]) -> None:
        out.append((path, cmd))
        for name, sub in sorted((getattr(cmd, "commands", None) or {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return out


def test_every_option_and_argument_has_a_description() -> None:
    found = commands()
    assert len(found) > 20  # the walk reached the subcommands
    bare = [f"servetune {' '.join(path)} {'/'.join(p.opts)}" for path, cmd in found for p in cmd.params
            if p.name != "help" and not (getattr(p, "help", None) or "").strip()]
    assert bare == []


def test_the_simulated_servers_sglang_flags_say_what_they_do() -> None:
    """``sim serve`` parses SGLang's own flags (argparse, as SGLang does): each says what it models too."""
    from servetune.sim.args import build_parser

    actions = [a for a in build_parser()._actions if a.dest != "help"]
    assert len(actions) > 15
    assert [a.option_strings[0] for a in actions if not (a.help or "").strip()] == []


def test_every_command_answers_help() -> None:
    runner = CliRunner()
    for path, cmd in commands():
        res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "160"})
        assert res.exit_code == 0, (path, res.output)
        assert "usage:" in res.output.lower() and (not path or path[-1] in res.output)
        if getattr(cmd, "help", None) is not None:  # the command's own one-line purpose is shown
            assert cmd.help.strip().split()[0] in res.output, path


def _paragraphs(doc: str) -> list[str]:
    """A docstring's prose paragraphs, each as one line of words (what the help must show unbroken)."""
    body = inspect.cleandoc(doc).partition("\f")[0]
    return [" ".join(p.split()) for p in body.split("\n\n") if p.strip() and not p.startswith("\b")]


def test_help_shows_switches_bare_and_paragraphs_whole() -> None:
    """Typer 0.29 prints ``<bool>`` after a switch as if it took a value, and keeps a docstring's line breaks
    after its first paragraph: neither may reach a reader."""
    runner = CliRunner()
    broken = []
    for path, cmd in commands():
        res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "1000"})
        assert res.exit_code == 0, (path, res.output)
        assert "<bool>" not in res.output, (path, [ln for ln in res.output.splitlines() if "<bool>" in ln])
        lines = [" ".join(ln.strip(" │").split()) for ln in res.output.splitlines()]
        doc = getattr(getattr(cmd, "callback", None), "__doc__", None) or getattr(cmd, "help", None) or ""
        if not cmd.add_help_option:  # `sim serve --help` is SGLang's argparse help, not Typer's
            continue
        broken += [(path, p) for p in _paragraphs(doc) if not any(p in ln for ln in lines)]
    assert broken == []
    demo = runner.invoke(app, ["demo", "--help"], env={"COLUMNS": "1000"}).output
    assert "engineer B's and the staged campaign; the report puts them side by side" in demo  # was cut at 'staged'
    assert "--dry-run " in runner.invoke(app, ["tune", "--help"], env={"COLUMNS": "200"}).output


# every command that gives a result: `servetune CMD --json` prints it as one JSON document on stdout
RESULT_COMMANDS = [["version"], ["bench"], ["tune"], ["validate"], ["query"], ["history"], ["load"], ["report"],
                   ["db", "upgrade"], ["db", "downgrade"], ["db", "current"], ["trace", "convert"],
                   ["sim", "profiles"], ["airflow", "env"], ["airflow", "pools"], ["demo"], ["serve"],
                   ["diagnose"]]


def test_every_result_command_takes_json_after_its_name() -> None:
    found = {tuple(path): cmd for path, cmd in commands()}
    runner = CliRunner()
    for path in RESULT_COMMANDS:
        flags = [p for p in found[tuple(path)].params if "--json" in p.opts]
        assert len(flags) == 1 and flags[0].is_flag, path  # a switch, never an option taking a value
        res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert "--json" in res.output, path
    # validate's report file moved to --report-out: --json is the switch, as for every command
    assert "--report-out" in runner.invoke(app, ["validate", "--help"], env={"COLUMNS": "200"}).output


def _run(*args: str) -> tuple[Any, str, int]:
    """``servetune ARGS`` in-process: stdout parsed as one JSON document, stderr as it came, the exit code."""
    res = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    try:
        doc = orjson.loads(res.stdout)
    except orjson.JSONDecodeError as exc:
        raise AssertionError(f"{args}: stdout is not one JSON document ({exc}): {res.stdout[:500]!r}"
                             f" stderr {res.stderr[-500:]!r}") from None
    return doc, res.stderr, res.exit_code


def test_validate_json_after_the_command(tmp_path: Path) -> None:
    doc, err, code = _run("validate", str(H200_TRIAL), "--json", "--report-out", str(tmp_path / "r.json"))
    assert code == 1 and doc["accepted"] is False  # rejected: the hit rate is missing
    assert "prefix_hit_rate" in {o["checklist"] for o in doc["report"]["results"] if not o["success"]}
    # the human verdict, on stderr
    assert "REJECTED" in err and "checklist items: prefix_hit_rate" in err
    assert "rejected: the prefix-cache hit rate" in err
    assert orjson.loads((tmp_path / "r.json").read_bytes())["success"] is False  # the report file as before
    assert _run("--json", "validate", str(H200_TRIAL))[0]["report"]["success"] is False  # the global form agrees


def test_local_commands_json_after_the_command(tmp_path: Path) -> None:
    assert _run("sim", "profiles", "--json") == _run("--json", "sim", "profiles")
    profiles, _, code = _run("sim", "profiles", "--json")
    assert code == 0 and "H100-80G" in profiles["gpu"] and profiles["gpu"]["H100-80G"]["memory_mib"] > 80_000
    assert "llama-3.1-8b" in profiles["model"]
    assert _run("version", "--json")[0] == {"version": __version__}
    out = tmp_path / "t.jsonl"
    done, err, code = _run("trace", "convert", "--from", "azure", str(TRACES / "azure_sample.csv"), str(out),
                           "--limit", "5", "--json")
    assert code == 0 and done["rows"] == 5 and done["out"] == str(out) and len(out.read_text().splitlines()) == 5
    assert "wrote 5 of" in err
    cmd, _, code = _run("serve", "--engine", "sim", "--model", "llama-3.1-8b", "--dry-run", "--json")
    assert code == 0 and cmd["engine"] == "sim" and cmd["command"][-6:-4] == ["--host", "127.0.0.1"]


@pytest.fixture(scope="module")
def warehouse(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A database of its own, migrated with `db upgrade --json`, and a campaign of MODEL to load."""
    url = localdb.create_database(pg_server_url)
    try:
        doc, _, code = _run("db", "upgrade", "--database-url", url, "--json")
        assert code == 0 and doc["revision"] == doc["head"] and "://" in doc["database"]
        yield url, write_campaign(tmp_path_factory.mktemp("campaign"), model=MODEL)
    finally:
        localdb.drop_database(pg_server_url, make_url(url).database)


def test_warehouse_commands_json_after_the_command(warehouse: tuple[str, Path], tmp_path: Path) -> None:
    url, campaign = warehouse
    loaded, err, code = _run("load", str(campaign), "--no-validate", "--database-url", url, "--json")
    assert code == 0 and loaded["trials"] == 15 and loaded["actions"] == {"inserted": 15}, err
    assert loaded["statuses"] == {"ok": 14, "rejected": 1} and loaded["errors"] == []
    assert f"experiment {loaded['experiment_id']}" in err  # the table, on stderr
    again, _, code = _run("load", str(campaign), "--no-validate", "--database-url", url, "--json")
    assert code == 0 and again["actions"] == {"unchanged": 15}

    history, err, code = _run("history", "--model", MODEL, "--database-url", url, "--json")
    assert code == 0 and [h["experiment_id"] for h in history] == [loaded["experiment_id"]]
    assert history[0]["trials_total"] == 15 and history[0]["ceiling"] == 64 and err == ""
    assert _run("history", "--model", "nobody", "--database-url", url, "--json")[0] == []

    rows, _, code = _run("query", "latency_vs_concurrency", "-p", f"model={MODEL}", "--database-url", url, "--json")
    assert code == 0 and rows and all(isinstance(r, dict) for r in rows)
    assert rows == _run("query", "latency_vs_concurrency", "-p", f"model={MODEL}", "--database-url", url,
                        "-f", "json")[0]  # --json is -f json
    none, err, code = _run("query", "latency_vs_concurrency", "-p", "model=nobody", "--database-url", url, "--json")
    assert code == 0 and none == [] and f"the warehouse knows: {MODEL}" in err

    current, _, code = _run("db", "current", "--database-url", url, "--json")
    assert code == 0 and current["revision"] == current["head"]

    from servetune.commands.outcome import outcome_document  # `demo --json`'s entry per experiment (demo needs Airflow)
    from servetune.experiment import ResultFolder

    outcome = orjson.loads(orjson.dumps(outcome_document(ResultFolder(campaign), url)))  # plain JSON types only
    assert outcome["experiment_id"] == loaded["experiment_id"] and outcome["model"] == MODEL
    assert outcome["warehouse_trials"] == {"accepted": 14, "rejected": 1, "all": 15}
    assert outcome["recommendation"]["concurrency"] > 0 and outcome["report"] is None
    assert outcome["verdict"][-1].startswith("Tuned answer: "), outcome["verdict"]


def test_report_json_after_the_command(warehouse: tuple[str, Path], tmp_path: Path) -> None:
    _, campaign = warehouse
    doc, err, code = _run("report", str(campaign), "--out", str(tmp_path / "r"), "--json")
    assert code == 0 and doc["report"] == str(tmp_path / "r" / "report.html") and Path(doc["report"]).is_file()
    assert doc["trials"] == 15 and all(Path(p).is_file() for p in doc["figures"]) and "15 trials" in err
