"""TuningPlan: the shipped plans load, and a bad plan is rejected with the path of the bad field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from servetune.plan import PlanError, load_plan, parse_plan

PLANS = Path(__file__).resolve().parent.parent / "plans"
MINIMAL = {"name": "x", "model": "m", "sla": {"p99_ttft_ms": 500}}


@pytest.mark.parametrize("name", ["8b-chat.yaml", "8b-vlm.yaml", "demo.yaml"])
def test_shipped_plans_load(name: str) -> None:
    plan = load_plan(PLANS / name)
    assert plan.stages.ramp.levels == sorted(plan.stages.ramp.levels)
    if name != "demo.yaml":  # the real plans measure at least 200 requests per level
        assert plan.stages.baseline.requests >= 200 and plan.stages.ramp.requests >= 200


def test_vlm_plan_has_images_and_shared_prefix() -> None:
    plan = load_plan(PLANS / "8b-vlm.yaml")
    assert plan.workload.images is not None and plan.workload.shared_prefix is not None


def test_defaults_follow_the_article() -> None:
    plan = parse_plan(MINIMAL)
    assert plan.stages.baseline.concurrency == 8
    assert plan.stages.baseline.requests == 200 and plan.stages.ramp.requests == 200
    assert plan.stages.ramp.levels[:4] == [16, 32, 48, 64]
    assert list(plan.stages.refine.grid) == ["chunked-prefill-size", "schedule-conservativeness"]


def bad(data: dict, tmp_path: Path) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(PlanError) as exc:
        load_plan(path)
    msg = str(exc.value)
    assert str(path) in msg
    return msg


@pytest.mark.parametrize(
    ("patch", "where", "why"),
    [
        ({"stages": {"ramp": {"levels": [64, 32]}}}, "stages.ramp.levels", "strictly increasing"),
        ({"stages": {"ramp": {"levles": [16]}}}, "stages.ramp.levles", "Extra inputs"),
        ({"stages": {"ramp": {"requests": 0}}}, "stages.ramp.requests", "greater than or equal to 1"),
        ({"stages": {"baseline": {"concurrency": 32}}}, "stages", "must start above baseline.concurrency"),
        ({"sla": {"max_error_rate": 0.1}}, "sla", "at least one of p99_ttft_ms"),
        ({"sla": {"p99_ttft_ms": 500, "gpu_memory_limit": 1.5}}, "sla.gpu_memory_limit", "less than or equal to 1"),
        ({"workload": {"input": {"kind": "lognormal", "median": -3, "sigma": 1}}}, "workload.input.lognormal.median",
         "greater than 0"),
        ({"engine": {"kind": "tgi"}}, "engine", "does not match any of the expected tags: 'sglang'"),
        ({"engine": {"kind": "sglang", "args": {"no-such-flag": 2}}}, "engine.sglang", "unknown flag --no-such-flag"),
        ({"engine": {"kind": "vllm", "max_num_seqs": 0}}, "engine.vllm.max_num_seqs",
         "bad value 0 for --max-num-seqs (vllm): must be >= 1"),
        ({"engine": {"kind": "vllm"}, "stages": {"refine": {"grid": {"chunked-prefill-size": [1024]}}}},
         "stages.refine.grid.chunked-prefill-size[0]", "the vllm engine refuses it"),
        ({"engine": {"kind": "sim"}, "stages": {"refine": {"grid": {"schedule-policy": ["nope"]}}}},
         "stages.refine.grid.schedule-policy[0]", "the sim engine refuses it"),
        ({"stages": {"refine": {"grid": {"chunked-prefill-size": []}}}}, "stages.refine.grid", "at least one value"),
        ({"budget": {"max_gpu_minutes": 0}}, "budget.max_gpu_minutes", "greater than 0"),
        ({"on_trial_failure": "retry"}, "on_trial_failure", "'continue' or 'stop'"),
    ],
)
def test_bad_plan_names_the_field(patch: dict, where: str, why: str, tmp_path: Path) -> None:
    data = {**MINIMAL, **patch}
    msg = bad(data, tmp_path)
    line = next((ln for ln in msg.splitlines() if ln.strip().startswith(where + ":")), None)
    assert line is not None, msg
    assert why in line, msg
    assert "Value error" not in msg


def test_missing_required_fields_are_all_listed(tmp_path: Path) -> None:
    msg = bad({"stages": {}}, tmp_path)
    for field in ("name", "model", "sla"):
        assert f"  {field}: Field required" in msg


def test_external_engine_needs_a_url_and_no_refinement(tmp_path: Path) -> None:
    msg = bad({**MINIMAL, "engine": {"kind": "external"}}, tmp_path)
    assert "engine.external.url: Field required" in msg
    msg = bad({**MINIMAL, "engine": {"kind": "external", "url": "http://127.0.0.1:1"}}, tmp_path)
    assert "cannot be restarted" in msg


def test_unreadable_and_non_yaml_files(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="cannot read plan"):
        load_plan(tmp_path / "nope.yaml")
    p = tmp_path / "broken.yaml"
    p.write_text("name: [unclosed\n")
    with pytest.raises(PlanError, match="not valid YAML"):
        load_plan(p)
    p.write_text("- a list\n")
    with pytest.raises(PlanError, match="must be a mapping"):
        load_plan(p)


def test_the_refinement_walks_the_engines_own_knobs_when_the_plan_names_none() -> None:
    """The default grid and running-request cap are the engine's (EngineBase.tuning): SGLang's chunked prefill
    and conservativeness with max-running-requests, vLLM's max-num-batched-tokens with max-num-seqs."""
    base = {"name": "p", "model": "m", "sla": {"p99_ttft_ms": 500}}
    sglang = parse_plan(base).stages.refine
    assert list(sglang.grid) == ["chunked-prefill-size", "schedule-conservativeness"]
    assert sglang.max_running_flag == "max-running-requests"
    vllm = parse_plan({**base, "engine": {"kind": "vllm"}}).stages.refine
    assert vllm.grid == {"max-num-batched-tokens": [1024, 2048, 4096, 8192]} and vllm.max_running_flag == "max-num-seqs"
    mine = parse_plan({**base, "stages": {"refine": {"grid": {"chunked-prefill-size": [2048]}}}}).stages.refine
    assert mine.grid == {"chunked-prefill-size": [2048]}  # the plan's own grid stands
