"""``servetune diagnose DIR`` as people read it: the campaign summary first and on one screen, trials in
stage and level order (never by id), each table's request set named, the detail of the serious trials
only unless asked, and ``--json`` on either side of the command (servetune.diagnose.summary)."""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from servetune.cli import app
from servetune.diagnose import diagnose_trials, read_trials, steady_set
from servetune.diagnose.summary import GROUP_OVER, summarize
from servetune.loadgen.config import LoadConfig
from servetune.result import TrialResult
from servetune.sim.virtual import simulate
from servetune.workload import build_requests
from servetune.workload.spec import Fixed, Mixture, MixturePart, WorkloadSpec

REPO = Path(__file__).resolve().parent.parent
CAMPAIGN = REPO / "tests" / "data" / "gpu-h200" / "campaign"  # 4 real H200 trials, file names not in stage order
# (stage, level) order of that campaign, by id: correctness 1, baseline 8, ramp 16, ramp 32
IN_ORDER = ["7470a42d", "1a867feb", "ec8d0b7a", "e6c1d967"]
SCREEN = 45


def run(*args: str, columns: int = 100):
    out = CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns)})
    assert out.exit_code == 0, out.output
    return out


def test_the_summary_comes_first_on_one_screen_in_stage_and_level_order() -> None:
    assert sorted(IN_ORDER) != IN_ORDER  # the files' (hash) order is not the one wanted: the test can fail
    for columns in (80, 100):
        lines = run("diagnose", str(CAMPAIGN), columns=columns).stdout.splitlines()
        assert lines[0].startswith("campaign a3f963c3b13640979a3790021e311754")
        assert len(lines) <= SCREEN, "\n".join(lines)
        rows = [next(i for i, line in enumerate(lines) if line.startswith(tid)) for tid in IN_ORDER]
        assert rows == sorted(rows) and rows[-1] - rows[0] == 3  # one line each, in campaign order
        assert [lines[i].split()[1:3] for i in rows] == [["correctness", "1"], ["baseline", "8"], ["ramp", "16"],
                                                         ["ramp", "32"]]
        assert all(len(line) <= columns for line in lines[: rows[-1] + 1])  # the table never wraps
    text = "\n".join(lines)
    assert "4 trials: 3 accepted, 1 passed" in text and "recommended (*): the base config at 16 streams" in text
    assert re.search(r"^ec8d0b7a .* 7\.77\*", text, re.M)  # the recommendation's trial is marked
    assert "findings: 0 critical, 0 warning, 16 info" in text and "prefix_cache.unknown 3" in text
    assert "try: start SGLang with --enable-cache-report" in text  # the kind worth acting on, with its advice
    assert "── trial" not in text and "--all" in text  # no critical or warning: no detail, and how to get it


def test_every_table_names_its_request_set_and_matches_the_summary() -> None:
    text = run("diagnose", str(CAMPAIGN), "--all", columns=200).stdout
    assert "goodput: req/s within the SLA over the requests completed in the steady window" in text
    details = [text.index(f"── trial {t.trial_id}") for t in sorted(read_trials(CAMPAIGN), key=lambda t: t.trial_id)]
    assert len(details) == 4 and min(details) > text.index("findings:")  # the detail follows the summary
    for t in read_trials(CAMPAIGN):
        part = text[text.index(f"── trial {t.trial_id}"):]
        part = part[: part.index("── trial", 1)] if "── trial" in part[1:] else part
        n = t.summary.ttft_ms.count  # the requests the summary's latencies cover
        flat = " ".join(part.split())
        named = re.search(r"summary figures over (the only|the \d+|all \d+) successful (.*?): TTFT", flat)
        assert named, part
        assert (1 if named[1] == "the only" else int(named[1].split()[1])) == n, named[0]
        assert f"by input length (prompt tokens; latencies in ms), over {named[1]} successful {named[2]}" in flat
        bucket_rows = re.findall(r"^\s+(\d+k?-\d+k|>=\d+k)\s+(\d+)\s", part, re.M)
        assert sum(int(k) for _, k in bucket_rows) == n  # the rows add up to the set they name


def test_a_critical_trial_gets_its_detail_and_the_whole_run_is_set_apart(tmp_path: Path) -> None:
    """Simulated campaign: the ramp trial's short decodes wait out 16k-token prefills (critical); the
    baseline has short prompts only. Only the ramp trial's detail follows the summary."""
    mixed = WorkloadSpec(seed=1, output=Fixed(value=64), input=Mixture(parts=[
        MixturePart(weight=0.85, dist=Fixed(value=256)), MixturePart(weight=0.15, dist=Fixed(value=16000))]))
    short = WorkloadSpec(seed=1, output=Fixed(value=64), input=Fixed(value=256))
    load = LoadConfig(concurrency=16, warmup_requests=16)
    ramp = simulate({"chunked_prefill_size": 16384}, build_requests(mixed, 200).requests, load)
    base = simulate({"chunked_prefill_size": 16384}, build_requests(short, 200).requests, load)
    trials = [dataclasses.replace(ramp, trial_id="0" * 32, stage="ramp", created_at="2026-01-01T00:00:01"),
              dataclasses.replace(base, trial_id="f" * 32, stage="baseline", created_at="2026-01-01T00:00:02")]
    for t in trials:
        t.save(tmp_path / "trials" / f"{t.trial_id}.json")
    lines = run("diagnose", str(tmp_path)).stdout.splitlines()
    text = "\n".join(lines)
    assert lines.index(next(x for x in lines if x.startswith("f" * 8))) < lines.index(
        next(x for x in lines if x.startswith("0" * 8)))  # baseline before ramp, whatever the ids say
    assert re.search(r"^0{8} .*critical interference\.long_prefill", text, re.M)
    top = text[text.index("to act on"):]
    assert top.split("\n")[1].lstrip().startswith("critical interference.long_prefill")  # criticals first
    assert "try: add --enable-mixed-chunk" in top
    assert f"── trial {'0' * 32}" in text and f"── trial {'f' * 32}" not in text  # the serious trial only
    assert text.index("to act on") < text.index("── trial")
    # the bucket table covers the summary's requests; the whole run, start-up included, is set apart
    inside, named = steady_set(ramp)
    assert len(inside) == ramp.summary.ttft_ms.count and named.startswith(f"the {len(inside)} successful")
    assert f"over {named}" in text and "whole run*" in text and "not comparable with the rows above" in text
    assert len(inside) < sum(1 for r in ramp.records if r.ok and not r.warmup)  # two sets: the test can fail
    bucket_rows = re.findall(r"^\s+(\d+k?-\d+k|>=\d+k)\s+(\d+)\s", text, re.M)
    assert bucket_rows and sum(int(k) for _, k in bucket_rows) == len(inside)  # the rows are the named set


def test_json_on_either_side_prints_the_findings_array_only(tmp_path: Path) -> None:
    folder = tmp_path / "campaign"
    shutil.copytree(CAMPAIGN, folder)
    after = run("diagnose", str(folder), "--json")
    before = run("--json", "diagnose", str(folder))
    for out in (after, before):
        found = orjson.loads(out.stdout)  # nothing but the document on stdout
        assert isinstance(found, list) and {f["trial_id"][:8] for f in found} == set(IN_ORDER)
        assert {"trial_id", "kind", "severity", "summary", "evidence", "advice"} == set(found[0])
    one = orjson.loads(run("diagnose", str(folder), "--json", "--trial", "ec8d").stdout)
    assert {f["trial_id"][:8] for f in one} == {"ec8d0b7a"}
    buckets = next(f for f in one if f["kind"] == "interference.by_input_length")["evidence"]
    assert buckets["request_set"].startswith(f"all {buckets['requests_in_set']} successful measured requests")
    bad = CliRunner().invoke(app, ["diagnose", str(folder), "--trial", "zzz"])
    assert bad.exit_code == 2 and "no trial whose id starts with" in bad.output


def test_many_trials_are_grouped_by_stage_level_and_config() -> None:
    trials = read_trials(CAMPAIGN)
    many = [dataclasses.replace(t, trial_id=f"{k:02d}{t.trial_id[2:]}") for t in trials
            for k in range(GROUP_OVER // len(trials) + 1)]
    assert len(many) > GROUP_OVER
    s = summarize(many, diagnose_trials(many))
    assert s.grouped and len(s.rows) == 4 and [r.stage for r in s.rows] == ["correctness", "baseline", "ramp", "ramp"]
    assert s.rows[2].status == f"{len(many) // 4} accepted" and len(s.rows[2].trial_ids) == len(many) // 4
    assert sum(s.statuses.values()) == len(many)


@pytest.mark.parametrize("status,stage,valid,want", [("failed", "ramp", None, "failed"),
                                                     ("rejected", "ramp", True, "rejected"),
                                                     ("ok", "ramp", False, "INVALID"), ("ok", "ramp", True, "accepted"),
                                                     ("ok", "correctness", False, "passed")])
def test_status_words(status: str, stage: str, valid: bool | None, want: str) -> None:
    from servetune.diagnose.summary import status as status_of

    t = TrialResult(trial_id="x", status=status, stage=stage)
    t.summary.valid = valid
    assert status_of(t) == want
