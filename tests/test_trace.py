"""Timed trace replay: the JSONL format and its errors, trace rows -> requests with arrivals, trace arrival
offsets (speed, rate rescale), plans with trace arrivals, the Azure/Mooncake converter, `servetune bench
--trace` against a live simulated SGLang server, and a virtual tune of a trace plan."""

from __future__ import annotations

import json
import statistics
from datetime import datetime
from pathlib import Path

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

import test_bench_cli
from servetune.cli import app
from servetune.loadgen import LoadConfig
from servetune.loadgen.strategies import arrival_offsets_s
from servetune.plan import PlanError
from servetune.workload import build_requests
from servetune.workload.spec import WorkloadSpec
from servetune.workload.trace import TraceError, TraceReplay, read_trace
from servetune.workload.trace_convert import convert
from test_tuning_rate import rate_plan

DATA = Path(__file__).parent / "data" / "traces"
REPLAY = DATA / "replay_40.jsonl"
sim_url = test_bench_cli.sim_url  # `servetune sim serve` in its own process (a fixture)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write(tmp_path: Path, lines: list[str], name: str = "t.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


# --- the format --------------------------------------------------------------------------------------------
def test_rows_are_read_sorted_with_their_optional_fields(tmp_path: Path) -> None:
    p = _write(tmp_path, ['{"arrival_s": 2.5, "input_tokens": 30, "output_tokens": 4, "session_id": 7}',
                          "",
                          '{"arrival_s": 0, "input_tokens": 10, "output_tokens": 2, "prefix_group": 3}',
                          '{"arrival_s": 2.5, "input_tokens": 20, "output_tokens": 3, "session_id": "u1"}'])
    rows = read_trace(p)
    assert [r.arrival_s for r in rows] == [0.0, 2.5, 2.5]
    assert [r.input_tokens for r in rows] == [10, 30, 20]  # ties keep the file's order
    assert [r.prefix_group for r in rows] == [3, -1, -1] and [r.session_id for r in rows] == [None, 7, "u1"]
    assert [r.line for r in rows] == [3, 1, 4]
    assert len(read_trace(REPLAY)) == 40


@pytest.mark.parametrize(("line", "why"), [
    ('{"input_tokens": 5, "output_tokens": 3}', "line 2: field 'arrival_s' is missing"),
    ('{"arrival_s": 1, "output_tokens": 3}', "line 2: field 'input_tokens' is missing"),
    ('{"arrival_s": -1, "input_tokens": 5, "output_tokens": 3}', "line 2: field 'arrival_s' must be a number"),
    ('{"arrival_s": "1s", "input_tokens": 5, "output_tokens": 3}', "line 2: field 'arrival_s' must be a number"),
    ('{"arrival_s": 1, "input_tokens": 0, "output_tokens": 3}', "line 2: field 'input_tokens' must be an integer >= 1"),
    ('{"arrival_s": 1, "input_tokens": 5, "output_tokens": 2.5}', "line 2: field 'output_tokens' must be an integer"),
    ('{"arrival_s": 1, "input_tokens": 5, "output_tokens": true}', "line 2: field 'output_tokens' must be an integer"),
    ('{"arrival_s": 1, "input_tokens": 5, "output_tokens": 3, "prefix_group": -2}', "line 2: field 'prefix_group'"),
    ('{"arrival_s": 1, "input_tokens": 5, "output_tokens": 3, "session_id": [1]}', "line 2: field 'session_id'"),
    ('{"arrival_s": 1, "input_tokens": 5,', "line 2: not valid JSON"),
    ("[1, 2, 3]", "line 2: expected a JSON object, got list"),
])
def test_a_bad_line_names_its_number_and_field(tmp_path: Path, line: str, why: str) -> None:
    p = _write(tmp_path, ['{"arrival_s": 0, "input_tokens": 5, "output_tokens": 3}', line])
    with pytest.raises(TraceError) as exc:
        read_trace(p)
    assert str(exc.value).startswith(f"{p}, {why}") and "\n" not in str(exc.value)


def test_missing_empty_and_edited_files(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="trace file not found"):
        read_trace(tmp_path / "nope.jsonl")
    with pytest.raises(TraceError, match="the trace has no rows"):
        read_trace(_write(tmp_path, [""]))
    p = _write(tmp_path, ['{"arrival_s": 0, "input_tokens": 5, "output_tokens": 3}'], "e.jsonl")
    spec = WorkloadSpec(trace=TraceReplay(path=str(p)))
    before = spec.fingerprint()
    p.write_text('{"arrival_s": 0, "input_tokens": 6, "output_tokens": 3}\n')  # same size, new contents
    assert read_trace(p)[0].input_tokens == 6  # the cache follows the file (mtime)
    assert spec.fingerprint() != before  # the fingerprint covers the trace's bytes


def test_the_trace_field_leaves_specs_without_one_as_they_were() -> None:
    assert "trace" not in WorkloadSpec().model_dump()  # every older fingerprint and plan digest holds
    spec = WorkloadSpec(trace={"path": str(REPLAY), "speed": 2})
    assert spec.model_dump()["trace"] == {"path": str(REPLAY), "speed": 2.0, "prefix_tokens": 0, "loop": False}
    faster = spec.model_copy(update={"trace": spec.trace.model_copy(update={"speed": 3})})
    assert spec.fingerprint() != faster.fingerprint()
    for bad in ({"path": "x", "speed": 0}, {"path": "x", "prefix_tokens": -1}, {"path": "x", "lop": True}):
        with pytest.raises(ValueError, match="trace"):
            WorkloadSpec(trace=bad)


# --- rows -> requests ------------------------------------------------------------------------------------
def test_requests_take_the_rows_lengths_arrivals_and_system_prompts() -> None:
    rows = _rows(REPLAY)
    spec = WorkloadSpec(input={"kind": "fixed", "value": 9999}, shared_prefix={"tokens": 900},
                        trace={"path": str(REPLAY), "speed": 2.0, "prefix_tokens": 64})
    reqs = build_requests(spec, 40).requests
    assert [r.input_tokens for r in reqs] == [row["input_tokens"] for row in rows]  # the spec's input is ignored
    assert [r.output_tokens for r in reqs] == [row["output_tokens"] for row in rows]
    assert [r.arrival_s for r in reqs] == pytest.approx([row["arrival_s"] / 2 for row in rows])
    assert [r.prefix_group for r in reqs] == [row.get("prefix_group", -1) for row in rows]
    assert all(len(r.prompt_text().split()) == r.input_tokens for r in reqs)  # one word per token
    systems = {g: {r.system for r in reqs if r.prefix_group == g} for g in (-1, 0, 1)}
    assert systems[-1] == {None} and all(len(systems[g]) == 1 for g in (0, 1)) and systems[0] != systems[1]
    assert all(len(next(iter(systems[g])).split()) == 64 for g in (0, 1))  # trace.prefix_tokens, not 900
    plain = build_requests(spec.model_copy(update={"trace": TraceReplay(path=str(REPLAY))}), 40).requests
    assert all(r.system is None and r.prefix_group == -1 for r in plain)  # prefix_tokens 0: no system prompts
    assert build_requests(spec, 10, start_index=30).requests[0].input_tokens == rows[30]["input_tokens"]


def test_more_requests_than_rows_loop_or_fail() -> None:
    spec = WorkloadSpec(trace={"path": str(REPLAY)})
    with pytest.raises(TraceError, match=r"request 40 asked of a trace of 40 rows .*trace.loop: true"):
        build_requests(spec, 41)
    looped = build_requests(spec.model_copy(update={"trace": TraceReplay(path=str(REPLAY), loop=True)}), 85).requests
    arrivals = np.asarray([r.arrival_s for r in looped])
    span = 10.25 * 40 / 39  # the trace's span plus one mean gap
    assert np.all(np.diff(arrivals) >= 0)
    assert arrivals[40:80] == pytest.approx(arrivals[:40] + span) and arrivals[80] == pytest.approx(2 * span)
    assert [r.input_tokens for r in looped[40:80]] == [r.input_tokens for r in looped[:40]]
    with pytest.raises(ValueError, match="a trace replays single requests, not conversations"):
        build_requests(WorkloadSpec(trace={"path": str(REPLAY)}, multi_turn={"turns": 2}), 2)


# --- arrivals ---------------------------------------------------------------------------------------------
def test_trace_offsets_follow_the_arrivals_speed_and_rate() -> None:
    rows = _rows(REPLAY)
    load = LoadConfig(mode="rate", concurrency=8, arrival="trace")  # no rate needed: the trace times itself
    fast = build_requests(WorkloadSpec(trace={"path": str(REPLAY), "speed": 2.0}), 40).requests
    assert arrival_offsets_s(load, 40, fast) == pytest.approx([row["arrival_s"] / 2 for row in rows])
    later = arrival_offsets_s(load, 30, fast[10:])  # offsets start at the first request's arrival
    assert later[0] == 0
    assert later == pytest.approx([(row["arrival_s"] - rows[10]["arrival_s"]) / 2 for row in rows[10:]])
    scaled = np.asarray(arrival_offsets_s(load.model_copy(update={"rate": 20.0}), 40, fast))
    assert 39 / scaled[-1] == pytest.approx(20.0)  # the mean rate is the rate asked for
    gaps, trace_gaps = np.diff(scaled), np.diff([row["arrival_s"] for row in rows])
    assert gaps == pytest.approx(trace_gaps * (gaps.sum() / trace_gaps.sum()))  # the trace's shape kept
    exact = arrival_offsets_s(load.model_copy(update={"rate": 20.0, "exact_rate": True, "warmup_requests": 5}), 40,
                              fast)
    assert exact == pytest.approx(scaled.tolist())  # exact_rate adds nothing to a trace
    synthetic = build_requests(WorkloadSpec(), 3).requests
    for reqs in (synthetic, None):
        with pytest.raises(ValueError, match="arrival: trace needs a workload with a trace"):
            arrival_offsets_s(load, 3, reqs)
    with pytest.raises(ValueError, match="required when mode is 'rate'"):
        LoadConfig(mode="rate", concurrency=8, arrival="poisson")


# --- plans ------------------------------------------------------------------------------------------------
def test_plans_with_trace_arrivals() -> None:
    trace = {"path": str(REPLAY), "loop": True}
    plan = rate_plan(load={"mode": "rate", "arrival": "trace"}, workload={"trace": trace})
    assert plan.load.arrival == "trace" and plan.load.arrivals_text() == "trace arrivals"
    cases = [
        ({"load": {"mode": "rate", "arrival": "trace"}}, "load.arrival: trace arrivals need a timed trace"),
        ({"load": {"mode": "concurrency", "arrival": "trace"}, "workload": {"trace": trace}}, "needs mode: rate"),
        ({"load": {"mode": "rate", "arrival": "trace"}, "workload": {"trace": trace, "multi_turn": {"turns": 2}}},
         "workload.trace: a trace replays single requests"),
    ]
    for over, why in cases:
        with pytest.raises(PlanError) as exc:
            rate_plan(**over)
        lines = str(exc.value).splitlines()
        assert len(lines) == 2 and why in lines[1], lines


def test_a_virtual_tune_scales_one_trace_to_each_rate(tmp_path: Path) -> None:
    import yaml

    data = rate_plan(load={"mode": "rate", "arrival": "trace", "max_in_flight": 256},
                     workload={"seed": 1, "trace": {"path": str(REPLAY), "prefix_tokens": 128, "loop": True}},
                     stages={"correctness": {"requests": 1}, "baseline": {"rate": 1, "requests": 40, "warmup": 4},
                             "ramp": {"levels": [2, 4, 8], "requests": 40, "warmup": 4},
                             "refine": {"enabled": False}},
                     validation={"min_measured": 40, "min_window_s": 10, "min_completions": 40},
                     ).model_dump(mode="json", exclude_none=True)
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data))
    r = CliRunner().invoke(app, ["tune", str(path), "--virtual", "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert "under trace arrivals" in r.output.replace("\n", " ")
    rows = _rows(REPLAY)
    trace_gaps = np.diff([row["arrival_s"] for row in rows])
    ramp = []
    for f in (tmp_path / "out" / "trials").glob("*.json"):
        d = json.loads(f.read_text())
        if d["stage"] != "ramp":
            continue
        ramp.append(d["load"]["rate"])
        recs = sorted(d["records"], key=lambda x: x["request_id"])
        sends = [x["t_send_s"] for x in recs]
        assert d["load"]["arrival"] == "trace" and len(recs) > 40  # more than the trace's rows: it loops
        assert [x["requested_input_tokens"] for x in recs] == [rows[i % 40]["input_tokens"] for i in range(len(recs))]
        assert (len(sends) - 1) / (sends[-1] - sends[0]) == pytest.approx(d["load"]["rate"], rel=1e-6)
        gaps = np.diff(sends[:40])
        assert gaps == pytest.approx(trace_gaps * (gaps.sum() / trace_gaps.sum()), abs=1e-6)
    assert sorted(ramp) == [2.0, 4.0, 8.0]


# --- the converter --------------------------------------------------------------------------------------
def _azure_offsets(stamps: list[str]) -> list[float]:
    """Seconds after the first stamp, read independently: microseconds by strptime, the 7th digit on its own."""
    def parse(s: str) -> tuple[datetime, int]:
        return datetime.strptime(s[:26], "%Y-%m-%d %H:%M:%S.%f"), int(s[26:] or 0)

    (t0, d0), later = parse(stamps[0]), [parse(s) for s in stamps]
    return [(t - t0).total_seconds() + (d - d0) * 1e-7 for t, d in later]


def test_convert_azure(tmp_path: Path) -> None:
    src = DATA / "azure_sample.csv"
    lines = src.read_text().splitlines()[1:]
    stamps = [line.split(",")[0] for line in lines]
    out = tmp_path / "az.jsonl"
    done = convert("azure", src, out)
    rows = read_trace(out)
    assert done.rows == done.read == len(rows) == 40
    offsets = _azure_offsets(stamps)
    assert [r.arrival_s for r in rows] == pytest.approx(offsets, abs=1e-9)  # the 100 ns digit kept
    assert [r.input_tokens for r in rows] == [int(line.split(",")[1]) for line in lines]
    zeros = sum(line.endswith(",0") for line in lines)
    assert zeros and done.raised_to_one == zeros  # GeneratedTokens 0: written as 1, and said so
    assert [r.output_tokens for r in rows] == [max(1, int(line.split(",")[2])) for line in lines]
    assert all(r.prefix_group == -1 for r in rows)

    window = convert("azure", src, out, start_s=5, duration_s=10, limit=6)
    rows = read_trace(out)
    inside = [t for t in offsets if 5 <= t < 15]
    assert window.rows == len(rows) == min(6, len(inside)) and window.read == 40
    # from the window's start
    assert [r.arrival_s for r in rows] == pytest.approx([t - 5 for t in inside[:6]], abs=1e-9)


def test_convert_mooncake_and_replay_its_prefixes(tmp_path: Path) -> None:
    src = DATA / "mooncake_sample.jsonl"
    rows_in = _rows(src)
    out = tmp_path / "mc.jsonl"
    assert convert("mooncake", src, out).rows == 40
    rows = read_trace(out)
    assert [r.arrival_s for r in rows] == pytest.approx([x["timestamp"] / 1000 for x in rows_in])
    assert [r.input_tokens for r in rows] == [x["input_length"] for x in rows_in]
    assert [r.output_tokens for r in rows] == [x["output_length"] for x in rows_in]
    assert [r.prefix_group for r in rows] == [x["hash_ids"][0] for x in rows_in]
    reqs = build_requests(WorkloadSpec(trace={"path": str(out), "prefix_tokens": 512}), 40).requests
    shared = [r for r in reqs if r.prefix_group == 0]
    assert len(shared) > 1 and len({r.system for r in shared}) == 1
    raw = [json.dumps({k: v for k, v in x.items() if k != "hash_ids"}) for x in rows_in[:3]]
    convert("mooncake", _write(tmp_path, raw, "nh.jsonl"), out)  # no hash_ids: no prefix group
    assert len(read_trace(out)) == 3 and all(r.prefix_group == -1 for r in read_trace(out))


@pytest.mark.parametrize(("source", "content", "why"), [
    ("azure", "time,ctx,gen\n1,2,3\n", "not an Azure LLM trace: no column TIMESTAMP, ContextTokens, GeneratedTokens"),
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.1,10,5\nyesterday,10,5\n",
     "line 3: TIMESTAMP must be a date and time"),
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.1,ten,5\n",
     "line 2: ContextTokens must be a token count"),
    ("mooncake", '{"timestamp": 0, "input_length": 5, "output_length": 2}\n{"timestamp": 10, "input_length": 5}\n',
     "line 2: field 'output_length' is missing"),
    ("mooncake", '{"timestamp": -4, "input_length": 5, "output_length": 2}\n', "line 1: field 'timestamp' must be"),
    ("mooncake", '{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": "a"}\n', "field 'hash_ids'"),
])
def test_convert_names_the_bad_line(tmp_path: Path, source: str, content: str, why: str) -> None:
    src = tmp_path / "in.txt"
    src.write_text(content)
    with pytest.raises(TraceError, match=why):
        convert(source, src, tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


def test_the_convert_command(tmp_path: Path) -> None:
    out = tmp_path / "mc.jsonl"
    r = CliRunner().invoke(app, ["trace", "convert", "--from", "mooncake", str(DATA / "mooncake_sample.jsonl"),
                                 str(out), "--duration-s", "3"])
    assert r.exit_code == 0, r.output
    n = sum(x["timestamp"] < 3000 for x in _rows(DATA / "mooncake_sample.jsonl"))
    assert f"wrote {n} of 40 requests to {out}" in " ".join(r.output.split()) and len(read_trace(out)) == n
    for args, why in ((["--from", "burstgpt"], "'burstgpt' is not a known source"),
                      (["--from", "azure", "--limit", "0"], "--limit: must be >= 1")):
        r = CliRunner().invoke(app, ["trace", "convert", *args, str(DATA / "azure_sample.csv"), str(out)])
        assert r.exit_code == 2 and why in r.output and len(r.output.strip().splitlines()) == 1, r.output
    r = CliRunner().invoke(app, ["trace", "convert", "--from", "azure", str(tmp_path / "nope.csv"), str(out)])
    assert r.exit_code == 2 and "nope.csv: no such file" in r.output


# --- servetune bench --trace ----------------------------------------------------------------------------
def test_bench_trace_input_errors_are_one_line(tmp_path: Path) -> None:
    base = ["bench", "--url", "http://127.0.0.1:9", "--concurrency", "4", "--out", str(tmp_path / "o.json")]
    bad = _write(tmp_path, ['{"arrival_s": 0, "input_tokens": 5, "output_tokens": 3}',
                            '{"arrival_s": 1, "input_tokens": 5, "output_tokens": "many"}'])
    for args, why in ((["--trace", str(tmp_path / "none.jsonl")], "none.jsonl: trace file not found"),
                      (["--trace", str(bad)], "line 2: field 'output_tokens' must be an integer"),
                      (["--trace", str(REPLAY), "--trace-speed", "0"], "--trace-speed: Input should be greater than 0"),
                      (["--trace", str(REPLAY), "--requests", "45"],
                       "--requests: 1 warm-up + 45 requests ask more than"),
                      (["--trace", str(REPLAY), "--warmup", "40"], "--warmup: 40 warm-up requests leave none"),
                      (["--trace-speed", "2", "--requests", "3"], "--trace-speed: needs --trace FILE"),
                      (["--arrival", "trace", "--requests", "3"], "--arrival trace: needs --trace FILE"),
                      ([], "--requests: required")):
        r = CliRunner().invoke(app, [*base, *args])
        assert r.exit_code == 2 and why in r.output and len(r.output.strip().splitlines()) == 1, (args, r.output)
        assert not (tmp_path / "o.json").exists()


def test_bench_replays_a_trace_against_the_simulated_server(sim_url: str, tmp_path: Path) -> None:
    rows = _rows(REPLAY)
    out = tmp_path / "trace.json"
    r = CliRunner().invoke(app, ["bench", "--url", sim_url, "--concurrency", "64", "--out", str(out), "--trace",
                                 str(REPLAY), "--trace-speed", "2", "--warmup", "2", "--endpoint", "generate"])
    assert r.exit_code == 0, r.output
    d = orjson.loads(out.read_bytes())
    assert d["load"]["arrival"] == "trace" and d["load"]["mode"] == "rate" and d["load"]["requests"] == 38
    recs = sorted(d["records"], key=lambda x: x["request_id"])
    assert len(recs) == 40 and all(x["error_class"] is None for x in recs)
    sent = [x["t_send_s"] - recs[0]["t_send_s"] for x in recs]
    late = [abs(s - row["arrival_s"] / 2) for s, row in zip(sent, rows, strict=True)]
    assert max(late) < 0.25 and statistics.median(late) < 0.05, late  # the trace's offsets, at twice the speed
    assert [x["requested_input_tokens"] for x in recs] == [row["input_tokens"] for row in rows]
    assert [x["prompt_tokens"] for x in recs] == [row["input_tokens"] for row in rows]  # the sim counts words
    assert [x["completion_tokens"] for x in recs] == [row["output_tokens"] for row in rows]
    assert d["workload"]["spec"]["trace"]["speed"] == 2.0

    scaled = tmp_path / "scaled.json"  # the first 20 rows, rescaled to 10 req/s
    r = CliRunner().invoke(app, ["bench", "--url", sim_url, "--concurrency", "64", "--out", str(scaled), "--trace",
                                 str(REPLAY), "--requests", "20", "--warmup", "0", "--rate", "10"])
    assert r.exit_code == 0, r.output
    sends = sorted(x["t_send_s"] for x in orjson.loads(scaled.read_bytes())["records"])
    assert 19 / (sends[-1] - sends[0]) == pytest.approx(10, rel=0.05)
