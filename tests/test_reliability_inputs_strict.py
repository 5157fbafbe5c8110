"""Issue 31: four kinds of bad input refused at their root, each with its one clear line through the real CLI.

1. a key written twice in a plan or workload YAML (servetune.strict_yaml): PyYAML kept the last one silently;
2. a boolean where an integer or a number belongs: pydantic's lax mode read ``true`` as 1;
3. inf or nan, in a plan or in ``servetune bench``'s options: ``--rate inf`` ran and recorded null;
4. a size past servetune's limits (servetune.numbers): a concurrency of 10**9 spun a dry run forever.

Each class is a table of several inputs, run in-process through the CLI's root group (typer's CliRunner, as
tests/test_reliability_inputs.py does); one of each also runs as a real ``python -m servetune`` process. The
exact line is asserted, then what must keep working (text numbers, merge keys, boolean engine flags, values at
the limits, the shipped plans).
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from bad_inputs import Case, problems, run_subprocess  # noqa: E402
from servetune.cli import app  # noqa: E402
from servetune.numbers import MAX_REQUESTS, MAX_STREAMS, check_bench_options  # noqa: E402
from servetune.plan import PlanError, load_plan, parse_plan  # noqa: E402
from servetune.strict_yaml import DuplicateKeyError, load_yaml  # noqa: E402
from servetune.workload.spec import MAX_IMAGE_SIDE, MAX_TOKENS  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
HEAD = "name: bad\nmodel: m\n"
SLA = "sla: {p99_ttft_ms: 500}\n"
BENCH = ["bench", "--url", "http://127.0.0.1:9", "--concurrency", "2", "--requests", "2", "--out", "o.json"]
HEADER = "error: plan.yaml: invalid tuning plan (1 error)"


def plan_text(sections: str) -> str:
    """A valid sglang plan with ``sections`` (YAML text) added; the default SLA unless they give one."""
    return HEAD + ("" if sections.startswith("sla:") else SLA) + sections


def cli(argv: list[str], where: Path, files: dict[str, str] | None = None,
        env: dict[str, str | None] | None = None) -> tuple[int, list[str], str]:
    """``servetune ARGV`` in ``where`` after writing ``files``: exit code, message lines, everything printed
    (with the traceback of any exception that escaped, as a user would have seen it)."""
    for name, text in (files or {}).items():
        (where / name).write_text(text)
    cwd = Path.cwd()
    try:
        os.chdir(where)
        r = CliRunner().invoke(app, argv, env={"COLUMNS": "80", "NO_COLOR": "1", "SERVETUNE_DATABASE_URL": None,
                                               **(env or {})})
    finally:
        os.chdir(cwd)
    everything = r.stdout + r.stderr
    if r.exc_info is not None and not issubclass(r.exc_info[0], SystemExit):
        everything += "".join(traceback.format_exception(*r.exc_info))
    return r.exit_code, [ln.rstrip() for ln in r.stderr.splitlines() if ln.strip()], everything


def tune(sections: str, tmp_path: Path, *, raw: bool = False) -> tuple[int, list[str], str]:
    return cli(["tune", "plan.yaml", "--dry-run"], tmp_path, {"plan.yaml": sections if raw else plan_text(sections)})


def refused(outcome: tuple[int, list[str], str], lines: list[str]) -> None:
    code, message, everything = outcome
    assert "Traceback" not in everything, everything
    assert (code, message) == (2, lines), everything


# --- 1. a key given twice -----------------------------------------------------------------------------------

#: (plan text, the key's dotted path, its line, the line of the first one)
DUPLICATE_PLAN = [
    (HEAD + SLA + "sla: {p99_ttft_ms: 100}\n", "sla", 4, 3),
    (HEAD + "name: other\n" + SLA, "name", 3, 1),
    (HEAD + SLA + "stages:\n  ramp:\n    levels: [16]\n    requests: 100\n    levels: [32]\n",
     "stages.ramp.levels", 8, 6),
    (HEAD + SLA + "stages:\n  ramp: {levels: [16, 32]}\nstages:\n  baseline: {concurrency: 4}\n", "stages", 6, 4),
    (HEAD + SLA + "protocols:\n  - {name: a, concurrency: 4, requests: 8, concurrency: 8}\n",
     "protocols.0.concurrency", 5, 5),
    (HEAD + SLA + "workload:\n  input: {kind: fixed, value: 3}\n  output: {kind: fixed, value: 8}\n"
     "  input: {kind: fixed, value: 4}\n", "workload.input", 7, 5),
    ('{"name": "a", "model": "m", "sla": {"p99_ttft_ms": 500}, "model": "n"}\n', "model", 1, 1),
    (HEAD + SLA + 'seed: 1\n"seed": 2\n', "seed", 5, 4),
]


@pytest.mark.parametrize(("text", "key", "line", "first"), DUPLICATE_PLAN, ids=[d[1] for d in DUPLICATE_PLAN])
def test_a_plan_key_given_twice_is_refused_naming_it_and_its_lines(text: str, key: str, line: int, first: int,
                                                                   tmp_path: Path) -> None:
    code, message, everything = tune(text, tmp_path, raw=True)
    assert "Traceback" not in everything and code == 2 and len(message) == 1, everything
    assert message[0].startswith(f"error: plan.yaml: not valid YAML at line {line}, column "), message
    assert message[0].endswith(f": duplicate key '{key}' (first at line {first})"), message


#: (file name, workload text, the key's dotted path, its line, the line of the first one)
DUPLICATE_WORKLOAD = [
    ("w.yaml", "input: {kind: fixed, value: 3}\ninput: {kind: fixed, value: 4}\n", "input", 2, 1),
    ("w.yaml", "output:\n  kind: fixed\n  value: 8\n  value: 9\n", "output.value", 4, 3),
    ("w.yml", "seed: 1\ninput: {kind: fixed, value: 3}\nseed: 2\n", "seed", 3, 1),
    ("w.yaml", "shared_prefix: {tokens: 64, tokens: 128}\n", "shared_prefix.tokens", 1, 1),
]


@pytest.mark.parametrize(("name", "text", "key", "line", "first"), DUPLICATE_WORKLOAD,
                         ids=[d[2] for d in DUPLICATE_WORKLOAD])
def test_a_workload_key_given_twice_is_refused_by_bench(name: str, text: str, key: str, line: int, first: int,
                                                        tmp_path: Path) -> None:
    code, message, everything = cli([*BENCH, "--workload", name], tmp_path, {name: text})
    assert "Traceback" not in everything and code == 2 and len(message) == 1, everything
    assert message[0].startswith(f"error: workload {name}: not valid YAML at line {line}, column "), message
    assert message[0].endswith(f": duplicate key '{key}' (first at line {first})"), message


# --- 2. a boolean where a number belongs -------------------------------------------------------------------

#: (plan sections, the field, what belongs there, the boolean as written)
BOOLEANS = [
    ("stages: {baseline: {concurrency: true}}", "stages.baseline.concurrency", "an integer", "true"),
    ("stages: {ramp: {levels: [16, true]}}", "stages.ramp.levels.1", "a number", "true"),
    ("stages: {ramp: {requests: false}}", "stages.ramp.requests", "an integer", "false"),
    ("stages: {refine: {warmup: true}}", "stages.refine.warmup", "an integer", "true"),
    ("repeats: {count: true}", "repeats.count", "an integer", "true"),
    ("budget: {max_gpu_minutes: true}", "budget.max_gpu_minutes", "a number", "true"),
    ("load: {mode: rate, max_in_flight: true}\nstages: {ramp: {levels: [4, 8]}}", "load.max_in_flight",
     "an integer", "true"),
    ("seed: false", "seed", "an integer", "false"),
    # sections other modules define: found by comparing what was written with what pydantic made of it
    ("sla: {p99_ttft_ms: true}", "sla.p99_ttft_ms", "a number", "true"),
    ("sla: {p99_ttft_ms: 500, max_error_rate: false}", "sla.max_error_rate", "a number", "false"),
    ("workload: {input: {kind: fixed, value: true}}", "workload.input.value", "an integer", "true"),
    ("validation: {min_completions: true}", "validation.min_completions", "an integer", "true"),
    ("protocols: [{name: a, concurrency: true, requests: 8}]", "protocols.0.concurrency", "an integer", "true"),
]


@pytest.mark.parametrize(("sections", "loc", "what", "value"), BOOLEANS, ids=[b[1] for b in BOOLEANS])
def test_a_boolean_where_a_number_belongs_is_refused(sections: str, loc: str, what: str, value: str,
                                                     tmp_path: Path) -> None:
    refused(tune(sections, tmp_path), [HEADER, f"  {loc}: Input should be {what}, not a boolean ({value})"])


def test_a_boolean_in_a_bench_workload_file_is_refused(tmp_path: Path) -> None:
    outcome = cli([*BENCH, "--workload", "w.yaml"], tmp_path, {"w.yaml": "output: {kind: fixed, value: true}\n"})
    refused(outcome, ["error: workload w.yaml: output.value: Input should be an integer, not a boolean (true)"])


# --- 3. inf and nan ------------------------------------------------------------------------------------------

#: (plan sections, the field): YAML's .inf/.nan and the text pydantic would read as one
NON_FINITE_PLAN = [
    ("load: {mode: rate}\nstages: {baseline: {rate: .inf}, ramp: {levels: [2, 4]}}", "stages.baseline.rate"),
    ("stages: {ramp: {levels: [16, .nan]}}", "stages.ramp.levels.1"),
    ("stages: {ramp: {levels: [16, inf]}}", "stages.ramp.levels.1"),
    ("stages: {baseline: {concurrency: .inf}}", "stages.baseline.concurrency"),
    ("stages: {ramp: {duration_s: .inf}}", "stages.ramp.duration_s"),
    ("budget: {max_gpu_minutes: .inf}", "budget.max_gpu_minutes"),
    ("load: {mode: rate, arrival: gamma, burstiness: .nan}\nstages: {ramp: {levels: [4, 8]}}", "load.burstiness"),
    ("sla: {p99_ttft_ms: .inf}", "sla.p99_ttft_ms"),
    ("sla: {p99_ttft_ms: -.inf}", "sla.p99_ttft_ms"),  # a bound (gt=0) broken by inf says so, not "> 0"
    ("sla: {p99_ttft_ms: 500, max_error_rate: nan}", "sla.max_error_rate"),  # nor "<= 1" for nan
    ("workload: {input: {kind: lognormal, median: .inf, sigma: 1}}", "workload.input.lognormal.median"),
    ("validation: {min_window_s: .inf}", "validation.min_window_s"),
    ("runner: {kind: local, grace_s: .inf}", "runner.grace_s"),
]


@pytest.mark.parametrize(("sections", "loc"), NON_FINITE_PLAN,
                         ids=[f"{n[1]}-{i}" for i, n in enumerate(NON_FINITE_PLAN)])
def test_a_non_finite_number_in_a_plan_is_refused(sections: str, loc: str, tmp_path: Path) -> None:
    refused(tune(sections, tmp_path), [HEADER, f"  {loc}: Input should be a finite number"])


#: (bench options, the line)
NON_FINITE_BENCH = [
    (["--rate", "inf"], "--rate: Input should be a finite number, got inf"),
    (["--rate", "nan"], "--rate: Input should be a finite number, got nan"),
    (["--rate", "-inf"], "--rate: Input should be a finite number, got -inf"),
    (["--timeout-s", "inf"], "--timeout-s: Input should be a finite number, got inf"),
    (["--idle-timeout", "nan"], "--idle-timeout: Input should be a finite number, got nan"),
    (["--rate", "5", "--arrival", "gamma", "--burstiness", "inf"], "--burstiness: Input should be a finite number,"
                                                                   " got inf"),
    (["--min-window-s", "nan"], "--min-window-s: Input should be a finite number, got nan"),
    (["--gpu-interval-ms", "inf"], "--gpu-interval-ms: Input should be a finite number, got inf"),
    (["--sla", "ttft_ms=inf"], "--sla ttft_ms: Input should be a finite number, got inf"),
    (["--sla", "ttft_ms=500", "--sla", "p99_e2e_ms=NaN"], "--sla p99_e2e_ms: Input should be a finite number, got NaN"),
]


@pytest.mark.parametrize(("options", "line"), NON_FINITE_BENCH, ids=[" ".join(o) for o, _ in NON_FINITE_BENCH])
def test_a_non_finite_bench_option_is_refused(options: list[str], line: str, tmp_path: Path) -> None:
    refused(cli([*BENCH, *options], tmp_path, {}), [f"error: {line}"])
    assert not (tmp_path / "o.json").exists()


def test_a_non_finite_number_in_a_bench_workload_file_is_refused(tmp_path: Path) -> None:
    files = {"w.yaml": "input: {kind: lognormal, median: .inf, sigma: 1}\n"}
    refused(cli([*BENCH, "--workload", "w.yaml"], tmp_path, files),
            ["error: workload w.yaml: input.lognormal.median: Input should be a finite number"])


# --- 4. sizes past the limits --------------------------------------------------------------------------------

#: (plan sections, the field, its limit)
SIZES_PLAN = [
    ("stages: {baseline: {concurrency: 1000000000}}", "stages.baseline.concurrency", MAX_STREAMS),
    ("stages: {ramp: {levels: [16, 1000000000]}}", "stages.ramp.levels.1", MAX_STREAMS),
    ("load: {mode: rate}\nstages: {ramp: {levels: [4, 1000000]}}", "stages.ramp.levels.1", 100_000),
    ("load: {mode: rate}\nstages: {baseline: {rate: 1000000}, ramp: {levels: [4, 8]}}", "stages.baseline.rate",
     100_000),
    ("stages: {ramp: {requests: 1000000000000}}", "stages.ramp.requests", MAX_REQUESTS),
    ("stages: {baseline: {warmup: 100000000}}", "stages.baseline.warmup", MAX_REQUESTS),
    ("stages: {refine: {requests: 1000000000000}}", "stages.refine.requests", MAX_REQUESTS),
    ("budget: {max_requests_per_trial: 1000000000}", "budget.max_requests_per_trial", MAX_REQUESTS),
    ("validation: {min_measured: 1000000000}", "validation.min_measured", MAX_REQUESTS),
    ("load: {mode: rate, max_in_flight: 1000000000}\nstages: {ramp: {levels: [4, 8]}}", "load.max_in_flight",
     MAX_STREAMS),
    ("protocols: [{name: a, concurrency: 1000000000, requests: 10}]", "protocols.0.concurrency", MAX_STREAMS),
    ("protocols: [{name: a, concurrency: 8, requests: 1000000000000}]", "protocols.0.requests", MAX_REQUESTS),
    # the workload: token lengths past any served context, images past any VLM's input, endless sessions
    ("workload: {input: {kind: lognormal, median: 1.0e12, sigma: 0.5}}", "workload.input.lognormal.median", MAX_TOKENS),
    ("workload: {input: {kind: fixed, value: 100000000000}}", "workload.input.fixed.value", MAX_TOKENS),
    ("workload: {output: {kind: uniform, min: 1, max: 100000000000}}", "workload.output.uniform.max", MAX_TOKENS),
    ("workload: {input: {kind: normal, mean: 512, std: 9, max: 100000000000}}", "workload.input.normal.max",
     MAX_TOKENS),
    ("workload: {images: {width: 100000, height: 512}}", "workload.images.width", MAX_IMAGE_SIDE),
    ("workload: {images: {width: 512, height: 100000}}", "workload.images.height", MAX_IMAGE_SIDE),
    ("workload: {images: {count: 1000}}", "workload.images.count", 64),
    ("workload: {images: {distinct: 100000000}}", "workload.images.distinct", 100_000),
    ("workload: {multi_turn: {turns: 100000}}", "workload.multi_turn.turns", 1000),
]


@pytest.mark.parametrize(("sections", "loc", "limit"), SIZES_PLAN,
                         ids=[f"{s[1]}-{i}" for i, s in enumerate(SIZES_PLAN)])
def test_a_size_past_the_limit_in_a_plan_is_refused(sections: str, loc: str, limit: int, tmp_path: Path) -> None:
    refused(tune(sections, tmp_path), [HEADER, f"  {loc}: Input should be less than or equal to {limit}"])


#: (bench options, the line)
SIZES_BENCH = [
    (["--concurrency", "1000000000"], "--concurrency: Input should be less than or equal to 100000, got 1000000000"),
    (["--requests", "1000000000000"], "--requests: Input should be less than or equal to 10000000, got 1000000000000"),
    (["--warmup", "100000000"], "--warmup: Input should be less than or equal to 10000000, got 100000000"),
    (["--rate", "1e6"], "--rate: Input should be less than or equal to 100000, got 1e+06"),
    (["--waves", "1000000"], "--waves: Input should be less than or equal to 100000, got 1000000"),
    (["--min-completions", "100000000"], "--min-completions: Input should be less than or equal to 10000000,"
                                         " got 100000000"),
]


@pytest.mark.parametrize(("options", "line"), SIZES_BENCH, ids=[" ".join(o) for o, _ in SIZES_BENCH])
def test_a_size_past_the_limit_in_bench_is_refused(options: list[str], line: str, tmp_path: Path) -> None:
    refused(cli([*BENCH, *options], tmp_path, {}), [f"error: {line}"])


# --- the real entry point, one input of each class -----------------------------------------------------------

REAL = [
    Case("dup", ["tune", "plan.yaml", "--dry-run"], ("duplicate key 'sla'", "line 4"),
         {"plan.yaml": HEAD + SLA + SLA}),
    Case("bool", ["tune", "plan.yaml", "--dry-run"], ("stages.baseline.concurrency", "boolean"),
         {"plan.yaml": plan_text("stages: {baseline: {concurrency: true}}")}, lines=2),
    Case("inf", [*BENCH, "--rate", "inf"], ("--rate", "finite", "inf")),
    Case("huge", ["tune", "plan.yaml", "--dry-run"], ("stages.baseline.concurrency", "100000"),
         {"plan.yaml": plan_text("stages: {baseline: {concurrency: 1000000000}}")}, lines=2),
]


@pytest.mark.parametrize("case", REAL, ids=[c.name for c in REAL])
def test_the_real_entry_point_gives_the_same_clear_line(case: Case, tmp_path: Path) -> None:
    out = run_subprocess(case, tmp_path)
    assert problems(case, out) == [], out.stderr


# --- what must keep working ----------------------------------------------------------------------------------

#: (plan sections, a check of the parsed plan)
ACCEPTED = [
    ('stages: {baseline: {concurrency: "8"}, ramp: {levels: ["16", 32], requests: "100"}}',
     lambda p: (p.stages.baseline.concurrency, p.stages.ramp.levels, p.stages.ramp.requests) == (8, [16, 32], 100)),
    (f"stages: {{ramp: {{levels: [16, {MAX_STREAMS}], requests: {MAX_REQUESTS}}}}}",
     lambda p: p.stages.ramp.levels[-1] == MAX_STREAMS and p.stages.ramp.requests == MAX_REQUESTS),
    ("load: {mode: rate}\nstages: {baseline: {rate: 0.5}, ramp: {levels: [1.5, 100000]}}",
     lambda p: p.stages.ramp.levels == [1.5, 100000]),
    ("engine: {kind: sglang, args: {disable-radix-cache: true}}",
     lambda p: p.engine_flags().get("disable-radix-cache") is True),
    ("stages:\n  baseline: &b {requests: 100, warmup: 8}\n  ramp:\n    <<: *b\n    warmup: 16\n",
     lambda p: (p.stages.ramp.requests, p.stages.ramp.warmup) == (100, 16)),  # a merge key may be overridden
    ("stages: {correctness: {enabled: false}, refine: {enabled: false}}",
     lambda p: not p.stages.correctness.enabled and not p.stages.refine.enabled),
]


@pytest.mark.parametrize(("sections", "check"), ACCEPTED, ids=[f"accepted-{i}" for i in range(len(ACCEPTED))])
def test_what_was_valid_still_is(sections: str, check, tmp_path: Path) -> None:  # noqa: ANN001
    path = tmp_path / "plan.yaml"
    path.write_text(plan_text(sections))
    assert check(load_plan(path))


def test_a_valid_plan_still_dry_runs(tmp_path: Path) -> None:
    code, message, everything = tune("stages: {ramp: {levels: [16, 32], requests: 50}}", tmp_path)
    assert code == 0 and "Traceback" not in everything, everything


@pytest.mark.parametrize("path", sorted((REPO / "plans").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_plan_reads_as_before(path: Path) -> None:
    text = path.read_text()
    assert load_yaml(text) == yaml.safe_load(text)
    assert load_plan(path) == parse_plan(yaml.safe_load(text), source=str(path))


def test_the_limits_themselves_are_accepted_by_bench() -> None:
    check_bench_options({"concurrency": MAX_STREAMS, "rate": 100_000.0, "requests": MAX_REQUESTS, "warmup": 0,
                         "timeout_s": 600.0, "sla": ["ttft_ms=500"], "waves": None})


def test_a_duplicate_key_error_is_a_yaml_error_with_its_place() -> None:
    with pytest.raises(yaml.YAMLError) as exc:
        load_yaml("a:\n  b: 1\n  b: 2\n")
    assert isinstance(exc.value, DuplicateKeyError)
    assert exc.value.problem == "duplicate key 'a.b' (first at line 2)"
    assert (exc.value.problem_mark.line, exc.value.problem_mark.column) == (2, 2)


def test_parse_plan_refuses_a_boolean_from_a_dict_too() -> None:
    with pytest.raises(PlanError) as exc:
        parse_plan({"name": "x", "model": "m", "sla": {"p99_ttft_ms": 500}, "stages": {"ramp": {"warmup": True}}})
    assert str(exc.value).splitlines()[1] == "  stages.ramp.warmup: Input should be an integer, not a boolean (true)"
