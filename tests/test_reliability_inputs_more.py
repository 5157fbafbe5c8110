"""Issue 31: four more kinds of bad input refused at their root, each with its one clear line through the real CLI.

1. a server URL with a path, a query string or a fragment (``--url http://host:port/v1`` 404ed every request):
   servetune.loadgen.config.http_base_url, so bench's ``--url``, ``serve --engine external --url`` and a plan's
   ``engine.url`` all refuse it;
2. options a dry run did not check (``tune --dry-run --trigger bogus``, a missing or corrupt ``--previous``);
3. ``serve --sglang-version`` naming a version with no flag catalogue (it fell back to another in silence);
4. an invalid environment variable name in a plan's ``engine.env`` (servetune.engines.common.env_name).

Each class is a table of several inputs, run in-process through the CLI's root group (typer's CliRunner); one
of each also runs as a real ``python -m servetune`` process; then what must keep working.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import bad_inputs_more as more  # noqa: E402
from bad_inputs import CASES, problems, run_subprocess  # noqa: E402
from servetune.engines.catalog import CATALOG_DIR  # noqa: E402
from servetune.loadgen.config import http_base_url  # noqa: E402
from servetune.plan import PlanError, parse_plan  # noqa: E402
from test_reliability_inputs_strict import cli  # noqa: E402  (one CLI runner for both tables)

SECRET = more.SECRET
HINT = "give the server's base URL, e.g. http://host:port; servetune adds /v1/chat/completions itself"
BENCH = ["bench", "--concurrency", "2", "--requests", "2", "--out", "o.json", "--url"]
PLAN = "name: bad\nmodel: m\nsla: {p99_ttft_ms: 500}\n"
SIM_PLAN = PLAN + "engine: {kind: sim}\nstages: {refine: {enabled: false}}\n"
HEADER = "error: plan.yaml: invalid tuning plan (1 error)"
KNOWN = "(catalogued: 0.5.5, 0.5.15, 0.5.17, 0.5.23)"


def refused(outcome: tuple[int, list[str], str], lines: list[str]) -> None:
    code, message, everything = outcome
    assert "Traceback" not in everything and SECRET not in everything, everything
    assert (code, message) == (2, lines), everything


# --- 1. a server URL with a path, a query string or a fragment -------------------------------------------------

#: (the URL given, what it has, how the message shows it: password, query and fragment never printed)
URLS = [
    ("http://127.0.0.1:9/v1", "a path", "http://127.0.0.1:9/v1"),
    ("http://127.0.0.1:9/v1/chat/completions", "a path", "http://127.0.0.1:9/v1/chat/completions"),
    ("https://example.invalid:443/sglang/", "a path", "https://example.invalid:443/sglang/"),
    (f"http://127.0.0.1:9/?api_key={SECRET}", "a query string", "http://127.0.0.1:9/?..."),
    (f"http://127.0.0.1:9?k={SECRET}", "a query string", "http://127.0.0.1:9?..."),
    ("http://127.0.0.1:9?", "a query string", "http://127.0.0.1:9?..."),
    ("http://127.0.0.1:9#top", "a fragment", "http://127.0.0.1:9#..."),
    (f"http://u:{SECRET}@127.0.0.1:9/v1", "a path", "http://u:***@127.0.0.1:9/v1"),
    ("http://127.0.0.1:9/v1?x=1#y", "a path and a query string and a fragment", "http://127.0.0.1:9/v1?...#..."),
]


def url_line(what: str, shown: str) -> str:
    return f"url has {what}, got {shown!r}: {HINT}"


@pytest.mark.parametrize(("url", "what", "shown"), URLS)
def test_bench_refuses_a_url_that_is_not_a_base_url(url: str, what: str, shown: str, tmp_path: Path) -> None:
    refused(cli([*BENCH, url], tmp_path), [f"error: --url: {url_line(what, shown)}"])
    assert not (tmp_path / "o.json").exists()  # refused before anything ran


@pytest.mark.parametrize(("url", "what", "shown"), URLS[::2])
def test_serve_external_refuses_a_url_that_is_not_a_base_url(url: str, what: str, shown: str,
                                                              tmp_path: Path) -> None:
    refused(cli(["serve", "--engine", "external", "--url", url, "--dry-run"], tmp_path),
            [f"error: --url: {url_line(what, shown)}"])


@pytest.mark.parametrize(("url", "what", "shown"), URLS[1::2])
def test_a_plan_refuses_an_external_url_that_is_not_a_base_url(url: str, what: str, shown: str,
                                                               tmp_path: Path) -> None:
    text = PLAN + f"engine: {{kind: external, url: {url!r}}}\nstages: {{refine: {{enabled: false}}}}\n"
    refused(cli(["tune", "plan.yaml", "--dry-run"], tmp_path, {"plan.yaml": text}),
            [HEADER, f"  engine.external.url: {url_line(what, shown)}"])


@pytest.mark.parametrize("url", ["http://127.0.0.1:30000", "http://127.0.0.1:30000/", "https://h.example:8443",
                                 "http://[::1]:30000", "http://user@h:1"])
def test_a_base_url_is_still_accepted(url: str) -> None:
    assert http_base_url(url) == url.rstrip("/")


# --- 2. every option a dry run would use is checked in the dry run ---------------------------------------------

#: (options after ``tune plan.yaml --dry-run``, files, the line)
DRY_RUN = [
    (["--trigger", "bogus"], {}, "error: --trigger must be one of manual, weekly, on_change, bench, got 'bogus'"),
    (["--trigger", ""], {}, "error: --trigger must be one of manual, weekly, on_change, bench, got ''"),
    (["--trigger", "Weekly"], {}, "error: --trigger must be one of manual, weekly, on_change, bench, got 'Weekly'"),
    (["--previous", "nope.json"], {},
     "error: --previous nope.json: [Errno 2] No such file or directory: 'nope.json'"),
    (["--previous", "p.json"], {"p.json": "{x"},
     "error: --previous p.json: unexpected character, expected a string key: line 1 column 2 (char 1)"),
    (["--previous", "p.json"], {"p.json": ""}, "error: --previous p.json: Input is a zero-length, empty document: "
                                               "line 1 column 1 (char 0)"),
    (["--previous", "p.json"], {"p.json": "[1, 2]"},
     "error: --previous p.json: not a recommendation.json (no 'config')"),
    (["--previous", "p.json"], {"p.json": '{"plan": "x"}'},
     "error: --previous p.json: not a recommendation.json (no 'config')"),
]


@pytest.mark.parametrize(("options", "files", "line"), DRY_RUN)
def test_a_dry_run_checks_every_option_a_real_run_checks(options: list[str], files: dict[str, str], line: str,
                                                         tmp_path: Path) -> None:
    refused(cli(["tune", "plan.yaml", "--dry-run", *options], tmp_path, {"plan.yaml": SIM_PLAN, **files}), [line])
    assert not (tmp_path / "runs").exists()


def test_a_dry_run_with_good_options_still_prints_the_trials(tmp_path: Path) -> None:
    code, _, everything = cli(["tune", "plan.yaml", "--dry-run", "--trigger", "weekly", "--previous", "p.json"],
                              tmp_path, {"plan.yaml": SIM_PLAN, "p.json": '{"config": {}}'})
    assert code == 0 and "trials the campaign would start" in everything, everything


# --- 3. an SGLang version with no flag catalogue ----------------------------------------------------------------

@pytest.mark.parametrize("version", ["banana", "9.9.9", "", "0.5.16", "v0.5.23", "0.5.23 "])
def test_serve_refuses_an_sglang_version_without_a_catalogue(version: str, tmp_path: Path) -> None:
    refused(cli(["serve", "--engine", "sglang", "--model", "m", "--dry-run", "--sglang-version", version], tmp_path,
                env={"SERVETUNE_CATALOG_CACHE": str(tmp_path / "cache")}),
            [f"error: --sglang-version: no flag catalogue for sglang {version!r} {KNOWN}; generate one with "
             "`python -m servetune.engines.catalog --python PY_WITH_SGLANG`"])


@pytest.mark.parametrize("version", ["0.5.5", "0.5.23", "0.5.99"])
def test_serve_takes_a_catalogued_or_runner_cached_version(version: str, tmp_path: Path) -> None:
    (tmp_path / "cache").mkdir()
    shutil.copy(CATALOG_DIR / "sglang-0.5.23.yaml", tmp_path / "cache" / "sglang-0.5.99.yaml")  # a runner's own
    code, _, everything = cli(["serve", "--engine", "sglang", "--model", "m", "--dry-run", "--sglang-version",
                               version], tmp_path, env={"SERVETUNE_CATALOG_CACHE": str(tmp_path / "cache")})
    assert code == 0 and "sglang.launch_server --model-path m" in everything, everything


# --- 4. an invalid environment variable name in engine.env -----------------------------------------------------

ENV_RULE = "not a valid environment variable name (letters, digits and _, not starting with a digit"


@pytest.mark.parametrize(("name", "loc", "tail"), [
    ("1BAD", "1BAD", ")"), ("A-B", "A-B", ")"), ("A=B", "A=B", ")"), ("A B", "A B", ")"), ("A.B", "A.B", ")"),
    ("É", "É", ")"), ("", "''", "; the name is empty)")])
def test_an_invalid_engine_env_name_is_refused_naming_it(name: str, loc: str, tail: str, tmp_path: Path) -> None:
    text = PLAN + f"engine:\n  kind: sglang\n  env: {{{json.dumps(name)}: {SECRET}, OK: x}}\n"
    refused(cli(["tune", "plan.yaml", "--dry-run"], tmp_path, {"plan.yaml": text}),
            [HEADER, f"  engine.sglang.env.{loc}: {ENV_RULE}{tail}"])


@pytest.mark.parametrize("kind", ["sim", "vllm", "external"])
def test_every_engine_kind_checks_its_env_names(kind: str) -> None:
    engine = {"kind": kind, "env": {"A-B": "x"}, **({"url": "http://127.0.0.1:9"} if kind == "external" else {})}
    with pytest.raises(PlanError, match=rf"engine\.{kind}\.env\.A-B: not a valid environment variable name"):
        parse_plan({"name": "bad", "model": "m", "sla": {"p99_ttft_ms": 500}, "engine": engine,
                    "stages": {"refine": {"enabled": False}}})


def test_valid_env_names_are_kept() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0", "_X": "1", "a1": "2", "HF_TOKEN": SECRET}
    plan = parse_plan({"name": "ok", "model": "m", "sla": {"p99_ttft_ms": 500}, "engine": {"kind": "sglang",
                       "env": env}})
    assert plan.engine.env == env


# --- the catalogue's cases, as real processes -----------------------------------------------------------------

NEW = {n for n, *_ in more.PLAN + more.BENCH + more.TUNE + more.OTHER + more.SERVE}
REAL = [c for c in CASES if c.name in {"bench_url_path_password", "tune_dry_run_previous_corrupt",
                                       "serve_sglang_version_banana", "plan_env_dash"}]


def test_the_catalogue_holds_the_new_cases() -> None:
    assert len(NEW) >= 10 and NEW <= {c.name for c in CASES} and len(REAL) == 4


@pytest.mark.parametrize("case", REAL, ids=[c.name for c in REAL])
def test_the_real_entry_point_gives_the_clear_line(case, tmp_path: Path) -> None:  # noqa: ANN001
    out = run_subprocess(case, tmp_path)
    assert problems(case, out) == [], out.stderr


# --- 5. a path that is no regular file: a FIFO, a device, a directory, a symlink loop -------------------------

def _special(where: Path, kind: str) -> str:
    """A path of ``kind`` in ``where`` (a FIFO blocked the reader for ever; the rest gave other reasons)."""
    import os

    path = where / kind
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "loop":
        os.symlink(where / "loop2", path)
        os.symlink(path, where / "loop2")
    else:
        return "/dev/zero"  # a character device: endless zeros
    return str(path)


WHAT = {"fifo": "is a FIFO, not a regular file", "dev": "is a character device, not a regular file",
        "dir": "is a directory, not a regular file", "loop": "Too many levels of symbolic links"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(WHAT))
def test_a_plan_that_is_no_regular_file_is_refused_without_reading_it(kind: str, tmp_path: Path) -> None:
    path = _special(tmp_path, kind)
    refused(cli(["tune", path, "--dry-run"], tmp_path), [f"error: {path}: cannot read plan: {WHAT[kind]}"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "dev", "dir"])
def test_a_workload_that_is_no_regular_file_is_refused_without_reading_it(kind: str, tmp_path: Path) -> None:
    path = _special(tmp_path, kind)
    refused(cli([*BENCH, "http://127.0.0.1:9", "--workload", path], tmp_path),
            [f"error: workload {path}: {WHAT[kind]}"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "dev"])
def test_a_result_that_is_no_regular_file_is_refused_without_reading_it(kind: str, tmp_path: Path) -> None:
    from servetune.result_check import ResultError, read_json

    path = _special(tmp_path, kind)
    with pytest.raises(ResultError, match=f"^{path}: cannot read \\({WHAT[kind]}\\)$"):
        read_json(path)
