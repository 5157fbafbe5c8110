"""A plan's protocols (servetune.plan.protocols): other ways of measuring the same server, run once
beside the campaign, judged by the same checklist and shown beside the tuned answer.

The campaigns here run the simulator in virtual time (SimTrialRunner); the Airflow path is
tests/test_airflow_dags.py's demo test."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from servetune.checklist_report import PLAIN_COLUMN
from servetune.experiment import ResultFolder
from servetune.plan import PlanError, load_plan, parse_plan
from servetune.plan.protocols import deep_merge, headline_value, protocol_workload
from servetune.report.html import write_report
from servetune.report.protocols import protocol_rows, rejection_sentences
from servetune.report.sources import load_campaign
from servetune.tuning.campaign import Campaign
from servetune.tuning.runner import SimTrialRunner
from servetune.validation.campaign import validate_campaign

DEMO = Path(__file__).resolve().parents[1] / "plans" / "weekly" / "demo.yaml"


def demo_data() -> dict:
    return yaml.safe_load(DEMO.read_text())


def test_a_distribution_of_another_kind_replaces_the_plans_and_the_rest_merges() -> None:
    base = {"input": {"kind": "lognormal", "median": 2048, "sigma": 0.4}, "seed": 3,
            "shared_prefix": {"tokens": 512, "share_ratio": 1.0}}
    merged = deep_merge(base, {"input": {"kind": "fixed", "value": 512}, "shared_prefix": {"tokens": 64}})
    assert merged == {"input": {"kind": "fixed", "value": 512}, "seed": 3,
                      "shared_prefix": {"tokens": 64, "share_ratio": 1.0}}
    assert deep_merge(base, {"input": {"median": 1024}})["input"] == {"kind": "lognormal", "median": 1024, "sigma": 0.4}
    plan = load_plan(DEMO)
    a = protocol_workload(plan.workload, plan.protocols[0])
    assert (a.input.kind, a.input.value, a.output.value, a.shared_prefix) == ("fixed", 512, 256, None)
    assert protocol_workload(plan.workload, plan.protocols[1]) is plan.workload


@pytest.mark.parametrize(("change", "message"), [
    (lambda p: p["protocols"].append(dict(p["protocols"][0])), "protocols: names must differ"),
    (lambda p: p["protocols"][0]["workload"].update(input={"kind": "fixed"}),
     "protocols[0].workload.input.fixed.value"),
    (lambda p: p["protocols"][1].update(flags={"chunked-prefill-size": "big"}),
     "protocols[1].flags: the sim engine refuses"),
    (lambda p: p["protocols"][0].update(headline="fastest"), "protocols.0.headline"),
    (lambda p: p["protocols"][0].update(batching="dynamic"), "protocols.0.batching"),
])
def test_a_bad_protocol_is_refused_with_its_path_before_anything_runs(change, message) -> None:
    data = demo_data()
    change(data)
    with pytest.raises(PlanError) as err:
        parse_plan(data, source="demo.yaml")
    assert message in str(err.value)


def test_headline_reads_a_summary_field_or_a_p99() -> None:
    from servetune.result import Percentiles, TrialSummary

    s = TrialSummary(decode_tokens_per_s=2611.5, e2e_ms=Percentiles(p99=11616.0))
    assert headline_value(s, "decode_tokens_per_s") == 2611.5 and headline_value(s, "p99_e2e_ms") == 11616.0
    assert headline_value(s, "goodput_rps") is None


@pytest.fixture(scope="module")
def demo_campaign(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    plan = load_plan(DEMO)
    Campaign(plan, SimTrialRunner(plan), out).run()
    validate_campaign(out, min_measured=plan.validation.min_measured)
    return out


def test_protocols_run_first_as_results_the_decisions_never_read(demo_campaign: Path) -> None:
    folder = ResultFolder(demo_campaign)
    trials = folder.read_trials()
    protocols = {t.load["protocol"]["name"]: t for t in trials if t.stage == "protocol"}
    assert set(protocols) == {"engineer-a", "engineer-b"}
    a, b = protocols["engineer-a"], protocols["engineer-b"]
    assert (a.load["mode"], a.load["concurrency"], a.server_config.get("disable-radix-cache")) == ("waves", 64, True)
    assert a.summary.input_len.p50 == a.summary.input_len.p99 and a.summary.prefix_hit_rate == 0.0
    assert ((b.load["mode"], b.load["concurrency"], "disable-radix-cache" in b.server_config)
            == ("concurrency", 32, False))
    assert b.summary.input_len.p99 > 1.5 * b.summary.input_len.p50 and b.summary.prefix_hit_rate > 0.1
    import orjson

    state = orjson.loads(folder.read_state_json() or b"{}")
    assert all(o["stage"] != "protocol" for o in state["outcomes"])
    assert len(state["outcomes"]) == len(trials) - 2
    assert min(t.created_at for t in trials) in {a.created_at, b.created_at}  # before any staged trial


def test_the_checklist_rejects_static_batches_and_keeps_the_distribution(demo_campaign: Path) -> None:
    """A's waves fill and drain (window_source ``waves``): no steady window, rejected; B passes every item."""
    rows = protocol_rows(load_campaign(str(demo_campaign)))
    assert [r["who"] for r in rows] == ["engineer-a", "engineer-b", "tuned (servetune)"]
    a, b, tuned = rows
    assert a["verdict"] == "rejected"
    assert a["failed"] == ["steady_window: window_source = 'waves' not in steady, stated"]
    assert a["quoted"].startswith("decode_tokens_per_s = ") and a["radix"] == "off"
    assert a["load"] == "static batches of 64"
    assert (b["verdict"], b["sla"], b["failed"]) == ("accepted", "met", [])
    assert tuned["verdict"] == "accepted" and tuned["sla"] == "met" and "concurrency" in tuned["quoted"]
    assert a["plain"] == [PLAIN_COLUMN[("steady_window", "window_source")]] and b["plain"] == []
    assert rejection_sentences(rows) == [
        f"engineer-a: rejected by the checklist: {a['plain'][0]} (checklist detail: steady_window: window_source"
        " = 'waves' not in steady, stated)"]
    html = write_report(load_campaign(str(demo_campaign)), demo_campaign / "report").html_path.read_text()
    assert html.index('id="protocols"') < html.index('id="key-figures"') and html.count('class="protocol"') == 3


def test_a_resumed_campaign_does_not_measure_a_protocol_again(demo_campaign: Path, tmp_path: Path) -> None:
    plan = load_plan(DEMO)
    out = tmp_path / "c"
    first = Campaign(plan, SimTrialRunner(plan), out, experiment_id="e1").run_protocols()
    again = Campaign.resume(plan, SimTrialRunner(plan), out, experiment_id="e1").run_protocols()
    assert [t.trial_id for t in again] == [t.trial_id for t in first]
    assert len(ResultFolder(out).trial_files()) == 2


def test_a_plan_without_protocols_shows_no_section(demo_campaign: Path, tmp_path: Path) -> None:
    from test_tuning_campaign import small_plan

    plan = small_plan()
    Campaign(plan, SimTrialRunner(plan), tmp_path).run()
    assert protocol_rows(load_campaign(str(tmp_path))) == []


def test_the_demo_prints_the_protocols_beside_the_answer(demo_campaign: Path, capsys) -> None:
    from rich.console import Console

    from servetune.commands.outcome import print_protocols

    print_protocols(Console(width=160, force_terminal=False), load_campaign(str(demo_campaign)))
    out = capsys.readouterr().out
    assert "one server, measured 3 ways (simulated)" in out
    lines = {ln.split("│")[1].strip(): ln for ln in out.splitlines() if ln.count("│") > 3}
    assert "decode 2,612 tok/s" in lines["engineer-a"] and "rejected" in lines["engineer-a"]
    assert "accepted" in lines["engineer-b"] and "met" in lines["tuned (servetune)"]
    assert "engineer-a: rejected by the checklist: static batches fill and drain" in out
    assert "(checklist detail: steady_window: window_source = 'waves'" in out


def test_the_verdict_opens_the_report_and_a_defaults_answer_says_so(demo_campaign: Path, tmp_path: Path) -> None:
    """The demo's answer is the engine defaults at one level: the verdict lines name who counts, on what
    workload and by how much the answer beats the best valid protocol; the recommendation table says
    "engine defaults" and the level; each heatmap cell is one config at one level, the recommended one the
    recommendation's own; the page fits 1,400 px in Chromium."""
    from markupsafe import escape

    from servetune.report.heatmap import AXES, DEFAULT, choose_cells, engine_default
    from servetune.report.protocols import protocol_trials
    from servetune.report.verdict import verdict_lines

    campaign = load_campaign(str(demo_campaign))
    rec = campaign.recommendation
    assert rec and rec["config"] == {}, rec["config"]  # the plan's story: the defaults win, the level is the answer
    lines = verdict_lines(campaign, protocol_trials(campaign))
    assert len(lines) == 3, lines
    assert lines[0].startswith("engineer-a's decode ") and "does not count: static batches fill and drain" in lines[0]
    assert lines[1].startswith("engineer-b's p99 E2E ") and "is valid: 1024-4096-token prompts" in lines[1]
    assert "a shared 512-token system prompt" in lines[1] and "at 32 streams its goodput is" in lines[1]
    b = next(t for t in campaign.trials if (t.load.get("protocol") or {}).get("name") == "engineer-b")
    gain = rec["goodput_rps"] / b.summary.goodput_rps - 1
    assert lines[2].startswith(f"Tuned answer: the engine defaults at {rec['concurrency']} concurrent streams")
    assert f"{gain:+.0%} over engineer-b" in lines[2] and gain > 0.02, (lines[2], gain)

    html = write_report(campaign, tmp_path / "report").html_path.read_text()
    assert html.index('id="verdict"') < html.index('id="protocols"') < html.index('id="key-figures"')
    assert all(str(escape(line)) in html for line in lines)
    table = html[html.index('id="rec-table"'):]
    table = table[: table.index("</table>")]
    assert 'id="rec-defaults"' in table and "engine defaults: no flag changed" in table
    assert f"<strong>{rec['concurrency']}</strong>" in table
    ties = rec.get("ties") or []
    assert ties and all(html.count(str(escape(line))) == 1 for line in ties)  # listed once, not again below

    cells = choose_cells(campaign.refine_trials() + [t for t in campaign.curve_trials()], campaign.sla, rec)
    chosen = [(cell, c) for cell, c in cells.items() if c[3]]
    assert [cell for cell, _ in chosen] == [(DEFAULT, DEFAULT)] and chosen[0][1][2] == rec["concurrency"]
    assert "missed SLA" not in chosen[0][1][1]  # the answer's own cell: its config at its level, which met it
    assert engine_default(campaign.trials, AXES[0]) == 8192  # the simulated server's own chunked-prefill-size

    from test_report import page_overflow

    found = page_overflow(html, tmp_path)
    assert found["over"] == [] and found["scroll"] <= 1400, found


def test_a_protocol_that_did_not_hold_its_load_does_not_count(demo_campaign: Path) -> None:
    """An INVALID protocol trial (it did not measure the load it states) is named with its reason and never
    compared with: with no valid protocol left, the tuned answer stands alone."""
    from servetune.report.protocols import protocol_trials
    from servetune.report.verdict import verdict_lines

    campaign = load_campaign(str(demo_campaign))
    b = next(t for t in campaign.trials if (t.load.get("protocol") or {}).get("name") == "engineer-b")
    b.summary.valid, b.summary.invalid_reasons = False, ["in flight 20.1 of 32 streams"]
    lines = verdict_lines(campaign, protocol_trials(campaign))
    assert len(lines) == 3 and lines[0].startswith("engineer-a's ")
    assert lines[1].startswith("engineer-b's p99 E2E ") and lines[1].endswith(
        "does not count: it did not measure the load it states (in flight 20.1 of 32 streams).")
    assert lines[2].startswith("Tuned answer: the engine defaults at ")
    assert lines[2].endswith("; no protocol passed the checklist to compare with.")
