"""Engines as plugins (issue 17): one registry, one interface; every kind round-trips its flags, and
``transformers`` is tunable and servable like the others."""

from __future__ import annotations

import shlex

import pytest
import yaml
from typer.testing import CliRunner

from servetune.cli import app
from servetune.engines import ENGINE_KINDS, ENGINES, EngineBase, parse_engine_config
from servetune.engines.knobs import KnobError, engine_flags, with_flags
from servetune.plan import PlanError, parse_plan
from servetune.runners.lifecycle import secure_launch

cli = CliRunner()

#: one tunable config per launched kind, with flags set
EXAMPLES = {
    "sglang": {"kind": "sglang", "model": "/m", "args": {"max-running-requests": 64, "schedule-policy": "lpm"}},
    "vllm": {"kind": "vllm", "model": "/m", "max_num_seqs": 32, "enable_prefix_caching": True},
    "sim": {"kind": "sim", "args": {"chunked-prefill-size": 4096}},
    "transformers": {"kind": "transformers", "model": "/m", "cb_max_memory_percent": 0.3, "cb_max_batch_tokens": 512},
    "external": {"kind": "external", "url": "http://127.0.0.1:30000"},
}
GRID = {"sglang": ("chunked-prefill-size", 2048), "vllm": ("max-num-batched-tokens", 2048),
        "sim": ("schedule-conservativeness", 0.7), "transformers": ("cb-max-batch-tokens", 1024)}


def test_every_kind_is_registered_under_its_own_discriminator():
    assert set(ENGINE_KINDS) == set(EXAMPLES)
    for kind, cls in ENGINES.items():
        assert issubclass(cls, EngineBase) and cls.model_fields["kind"].default == kind


@pytest.mark.parametrize("kind", ENGINE_KINDS)
def test_flags_round_trip_through_the_config(kind):
    cfg = parse_engine_config(EXAMPLES[kind])
    flags = engine_flags(cfg)
    again = with_flags(cfg, flags)
    assert again == cfg and engine_flags(again) == flags
    if kind in GRID:
        flag, value = GRID[kind]
        changed = with_flags(cfg, {**flags, flag: value})
        assert engine_flags(changed)[flag] == value and type(changed) is type(cfg)
    else:
        with pytest.raises(KnobError, match="takes no server flags"):
            with_flags(cfg, {"max-running-requests": 8})


@pytest.mark.parametrize("kind", ENGINE_KINDS)
def test_the_interface_answers_for_every_kind(kind):
    from servetune.telemetry.prometheus import DIALECTS

    cfg = parse_engine_config(EXAMPLES[kind])
    assert cfg.health_paths and cfg.info_paths
    assert cfg.metric_prefix is None or cfg.metric_prefix in DIALECTS
    if cfg.launches:
        argv = cfg.launch_argv(host="127.0.0.1", port=1234)
        assert "1234" in argv and cfg.endpoint_url is None
        assert secure_launch(cfg, argv)[0] == argv  # no secrets here: nothing moves
    else:
        assert cfg.endpoint_url == "http://127.0.0.1:30000"


def test_transformers_knobs_render_its_real_flags():
    cfg = parse_engine_config({**EXAMPLES["transformers"], "cb_block_size": 32, "cb_num_blocks": 4096})
    argv = cfg.launch_argv(host="h", port=1)
    assert argv[argv.index("--continuous-batching"):] == [
        "--continuous-batching", "--cb-use-cuda-graph", "--cb-block-size", "32", "--cb-num-blocks", "4096",
        "--cb-max-batch-tokens", "512", "--cb-max-memory-percent", "0.3"]
    off = with_flags(cfg, {**engine_flags(cfg), "cb-use-cuda-graph": False}).launch_argv(host="h", port=1)
    assert "--no-cb-use-cuda-graph" in off
    with pytest.raises(KnobError, match="continuous_batching: true"):
        with_flags(cfg.model_copy(update={"continuous_batching": False}), {"cb-max-batch-tokens": 256})
    with pytest.raises(KnobError, match="transformers knobs servetune tunes are"):
        with_flags(cfg, {"max-running-requests": 8})


def _plan(engine: dict, refine: dict) -> dict:
    return {"name": "t", "model": "/models/m1b", "engine": engine, "sla": {"p99_ttft_ms": 2000},
            "stages": {"baseline": {"concurrency": 8}, "ramp": {"levels": [16, 32]}, "refine": refine}}


def test_a_transformers_plan_with_a_refine_grid_validates():
    plan = parse_plan(_plan({"kind": "transformers", "cb_max_memory_percent": 0.3},
                            {"grid": {"cb-max-batch-tokens": [256, 512, 1024], "cb-use-cuda-graph": [True, False]},
                             "set_max_running": False}))
    assert plan.engine.model == "/models/m1b"  # written once, at the top
    assert plan.engine_flags() == {"cb-max-memory-percent": 0.3, "cb-use-cuda-graph": True}


def test_a_transformers_grid_value_it_would_refuse_fails_the_plan():
    with pytest.raises(PlanError, match=r"grid.cb-max-memory-percent\[0\]: the transformers engine refuses it"):
        parse_plan(_plan({"kind": "transformers"}, {"grid": {"cb-max-memory-percent": [1.5]},
                                                    "set_max_running": False}))
    with pytest.raises(PlanError, match="set_max_running: the transformers engine has no flag capping running"):
        parse_plan(_plan({"kind": "transformers"}, {"grid": {"cb-max-batch-tokens": [256]}}))
    with pytest.raises(PlanError, match="max_running_flag: the transformers engine refuses it"):
        parse_plan(_plan({"kind": "transformers"}, {"grid": {"cb-max-batch-tokens": [256]},
                                                    "max_running_flag": "max-running-requests"}))


def test_tune_dry_run_of_a_transformers_plan(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(_plan({"kind": "transformers"}, {"grid": {"cb-max-batch-tokens": [256, 512]},
                                                                     "set_max_running": False})))
    r = cli.invoke(app, ["tune", str(path), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "no simulator profile" in r.output


def test_serve_dry_run_prints_the_transformers_argv():
    r = cli.invoke(app, ["serve", "--engine", "transformers", "--model", "/models/m1b",
                         "--set", "cb-max-batch-tokens=512", "--set", "cb_max_memory_percent=0.3", "--port", "8123",
                         "--gpus", "0", "--dry-run"])
    assert r.exit_code == 0, r.output
    assert shlex.split(r.stdout) == [
        "env", "CUDA_VISIBLE_DEVICES=0", "python3", "-m", "transformers.cli.transformers", "serve", "/models/m1b",
        "--host", "127.0.0.1", "--port", "8123", "--device", "cuda", "--dtype", "bfloat16", "--continuous-batching",
        "--cb-use-cuda-graph", "--cb-max-batch-tokens", "512", "--cb-max-memory-percent", "0.3"]


def test_serve_names_what_does_not_apply_to_transformers():
    r = cli.invoke(app, ["serve", "--engine", "transformers", "--model", "/m", "--sglang-version", "0.5.23",
                         "--dry-run"])
    assert r.exit_code == 2 and "--sglang-version does not apply to --engine transformers" in r.output
    r = cli.invoke(app, ["serve", "--engine", "transformers", "--dry-run"])
    assert r.exit_code == 2 and "--engine transformers needs --model PATH" in r.output


def test_serve_help_lists_every_kind():
    r = cli.invoke(app, ["serve", "--help"])
    assert all(kind in r.output for kind in ENGINE_KINDS)
