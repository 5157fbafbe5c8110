"""Engine flag values SGLang (or vLLM) would refuse fail at plan validation, before any GPU is touched.

The bounds come from the catalogue's hand-kept ``limits:`` (argparse's ``type=int`` knows none); they must
ship in every catalogue that has the flag and survive a regeneration from a real probe dump: the recorded
output of ``sglang_probe.py check`` under SGLang 0.5.17 on the H200 (tests/data/gpu-h200-sglang).
"""

from __future__ import annotations

import json
import lzma
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from servetune.engines import FlagError, engine_from_cli
from servetune.engines.catalog import (
    Catalog,
    available_versions,
    cache_runner_catalog,
    catalog_for,
    catalog_from_probe,
    hand_kept,
    load_catalog,
    write_catalog,
)
from servetune.engines.sglang import adopt_runner_version, interpret_parser_check
from servetune.plan import PlanError, parse_plan

PROBE = Path(__file__).parent / "data" / "gpu-h200-sglang" / "probe-check-0.5.17.json.xz"
MINIMAL = {"name": "x", "model": "m", "sla": {"p99_ttft_ms": 500}}
ALWAYS_LIMITED = ("chunked-prefill-size", "schedule-conservativeness", "max-running-requests", "mem-fraction-static",
                  "tp-size", "dp-size", "pp-size", "max-total-tokens", "max-prefill-tokens", "context-length",
                  "page-size", "stream-interval")

#: (flag, a value SGLang refuses, the rule the message states)
REFUSED = [
    ("chunked-prefill-size", 0, "must be -1 or >= 1"),
    ("chunked-prefill-size", -2, "must be -1 or >= 1"),
    ("schedule-conservativeness", -0.5, "must be >= 0"),
    ("max-running-requests", 0, "must be >= 1"),
    ("mem-fraction-static", 1.5, "must be > 0 and < 1"),
    ("mem-fraction-static", 1.0, "must be > 0 and < 1"),
    ("mem-fraction-static", 0.0, "must be > 0 and < 1"),
    ("cuda-graph-max-bs", 0, "must be >= 1"),
    ("cuda-graph-max-bs-decode", 0, "must be >= 1"),
    ("tp-size", 0, "must be >= 1"),
    ("dp-size", 0, "must be >= 1"),
    ("pp-size", -1, "must be >= 1"),
    ("max-total-tokens", 0, "must be >= 1"),
    ("max-prefill-tokens", "0k", "must be >= 1"),
    ("context-length", -4096, "must be >= 1"),
    ("page-size", 0, "must be >= 1"),
    ("stream-interval", 0, "must be >= 1"),
]
ACCEPTED = [("chunked-prefill-size", -1), ("chunked-prefill-size", 1), ("schedule-conservativeness", 0),
            ("max-running-requests", 1), ("mem-fraction-static", 0.01), ("mem-fraction-static", 0.99),
            ("cuda-graph-max-bs", 1), ("tp-size", 1), ("max-total-tokens", "128k"), ("context-length", "32Ki"),
            ("page-size", 1), ("stream-interval", 1)]


def _probe_dump() -> dict[str, Any]:
    return json.loads(lzma.decompress(PROBE.read_bytes()))["catalog"]


def _plan_error(patch: dict[str, Any]) -> list[str]:
    with pytest.raises(PlanError) as exc:
        parse_plan({**MINIMAL, **patch})
    return str(exc.value).splitlines()


@pytest.mark.parametrize(("flag", "value", "rule"), REFUSED, ids=[f"{f}={v}" for f, v, _ in REFUSED])
def test_each_limit_refused_at_plan_validation(flag: str, value: Any, rule: str) -> None:
    lines = _plan_error({"engine": {"kind": "sglang", "version": "0.5.17", "args": {flag: value}}})
    assert len(lines) == 2, lines  # the plan's header and one line for the flag
    assert lines[1].startswith(f"  engine.sglang: bad value {value!r} for --{flag} (sglang 0.5.17): {rule} ("), lines
    note = load_catalog("sglang", "0.5.17").limits[flag].note
    assert lines[1].endswith(f"({note})")


@pytest.mark.parametrize(("flag", "value"), ACCEPTED, ids=[f"{f}={v}" for f, v in ACCEPTED])
def test_a_valid_value_is_accepted(flag: str, value: Any) -> None:
    plan = parse_plan({**MINIMAL, "engine": {"kind": "sglang", "version": "0.5.17", "args": {flag: value}}})
    assert plan.engine.args[flag] == value or str(plan.engine.args[flag]) == str(value)


def test_every_shipped_catalogue_carries_the_limits() -> None:
    versions = available_versions("sglang")
    assert {"0.5.5", "0.5.15", "0.5.17", "0.5.23"} <= set(versions)
    for version in versions:
        cat = load_catalog("sglang", version)
        for flag in ALWAYS_LIMITED:
            assert cat.canonical(flag) in cat.limits, (version, flag)
        graph = "cuda-graph-max-bs-decode" if "cuda-graph-max-bs-decode" in cat.flags else "cuda-graph-max-bs"
        assert graph in cat.limits, version
        assert all(limit.note for limit in cat.limits.values())
    # 0.5.5 names the sizes --tensor-parallel-size etc.: --tp-size (an alias there) is checked all the same
    with pytest.raises(FlagError, match=r"bad value 0 for --tensor-parallel-size \(sglang 0\.5\.5\): must be >= 1"):
        engine_from_cli("sglang", model="/m", version="0.5.5", sets=["tp-size=0"])


def test_set_on_the_command_line_meets_the_same_limits() -> None:
    with pytest.raises(FlagError) as err:
        engine_from_cli("sglang", model="/m", sets=["mem-fraction-static=1.5"])
    assert str(err.value).startswith("bad value 1.5 for --mem-fraction-static (sglang 0.5.23): must be > 0 and < 1")
    with pytest.raises(FlagError, match=r"bad value 'lots' for --max-total-tokens \(sglang 0\.5\.23\): expected an "
                                        r"integer, plain or with a suffix"):
        engine_from_cli("sglang", model="/m", sets=["max-total-tokens=lots"])


def test_refine_grid_values_are_checked_with_the_same_limits() -> None:
    lines = _plan_error({"engine": {"kind": "sglang", "version": "0.5.17"},
                         "stages": {"refine": {"grid": {"chunked-prefill-size": [0, 2048]}}}})
    assert lines[1].startswith("  stages.refine.grid.chunked-prefill-size[0]: the sglang engine refuses it: "
                               "bad value 0 for --chunked-prefill-size (sglang 0.5.17): must be -1 or >= 1 (")
    lines = _plan_error({"engine": {"kind": "sglang"},
                         "stages": {"refine": {"grid": {"schedule-conservativeness": [0.3, 1.0, -1.0]}}}})
    assert lines[1].startswith("  stages.refine.grid.schedule-conservativeness[2]: the sglang engine refuses it: "
                               "bad value -1.0 for --schedule-conservativeness (sglang 0.5.23): must be >= 0 (")
    lines = _plan_error({"engine": {"kind": "sim"},  # the simulator speaks SGLang's flags: the same limits
                         "stages": {"refine": {"grid": {"max-running-requests": [8, 0]}}}})
    assert "stages.refine.grid.max-running-requests[1]: the sim engine refuses it: bad value 0" in lines[1]
    ok = parse_plan({**MINIMAL, "stages": {"refine": {"grid": {"chunked-prefill-size": [-1, 1, 8192]}}}})
    assert ok.stages.refine.grid["chunked-prefill-size"] == [-1, 1, 8192]


@pytest.mark.parametrize(("patch", "where", "message"), [
    ({"max_num_seqs": 0}, "engine.vllm.max_num_seqs", "bad value 0 for --max-num-seqs (vllm): must be >= 1"),
    ({"gpu_memory_utilization": 1.2}, "engine.vllm.gpu_memory_utilization",
     "bad value 1.2 for --gpu-memory-utilization (vllm): must be > 0 and <= 1"),
    ({"max_num_batched_tokens": -8}, "engine.vllm.max_num_batched_tokens",
     "bad value -8 for --max-num-batched-tokens (vllm): must be >= 1"),
])
def test_vllm_knob_limits(patch: dict[str, Any], where: str, message: str) -> None:
    lines = _plan_error({"engine": {"kind": "vllm", **patch}, "stages": {"refine": {"enabled": False}}})
    assert lines[1].startswith(f"  {where}: {message} ("), lines
    lines = _plan_error({"engine": {"kind": "vllm"}, "stages": {"refine": {
        "grid": {"max-num-seqs": [16, 0]}, "max_running_flag": "max-num-seqs"}}})
    assert lines[1].startswith("  stages.refine.grid.max-num-seqs[1]: the vllm engine refuses it: bad value 0 for "
                               "--max-num-seqs (vllm): must be >= 1 ("), lines
    full = parse_plan({**MINIMAL, "engine": {"kind": "vllm", "gpu_memory_utilization": 1.0},
                       "stages": {"refine": {"grid": {"max-num-seqs": [1]}, "max_running_flag": "max-num-seqs"}}})
    assert full.engine.gpu_memory_utilization == 1.0  # vLLM's own bound is <= 1


def test_limits_carried_over_when_regenerated_from_a_probe_dump(tmp_path: Path) -> None:
    """The recorded 0.5.17 parser output, regenerated: the hand-kept limits (and removals) come back."""
    dump = _probe_dump()
    shipped = load_catalog("sglang", "0.5.17")
    fresh = catalog_from_probe(dump, *hand_kept("sglang", "0.5.17"))
    assert fresh.limits == shipped.limits and fresh.removed == shipped.removed
    assert set(fresh.flags) == set(shipped.flags)  # the same parser (its set-valued choices may list in any order)
    bare = catalog_from_probe(dump)  # without the hand-kept facts the parser alone knows no bound
    assert bare.limits == {} and bare.coerce("chunked-prefill-size", 0) == ("chunked-prefill-size", 0)
    path = write_catalog(fresh, tmp_path)
    assert yaml.safe_load(path.read_text())["limits"]["mem-fraction-static"] == {
        "gt": 0, "lt": 1, "note": shipped.limits["mem-fraction-static"].note}
    assert Catalog.model_validate(yaml.safe_load(path.read_text())).limits == shipped.limits  # read back alike
    # a hand edit to the existing file in --out survives (the existing catalogue of that version wins)
    data = yaml.safe_load(path.read_text())
    data["limits"]["max-running-requests"] = {"ge": 2, "note": "kept by hand"}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    again = catalog_from_probe(dump, *hand_kept("sglang", "0.5.17", tmp_path))
    assert again.limits["max-running-requests"].ge == 2
    # a limit keyed by another version's name follows the flag through its alias (0.5.5: --tensor-parallel-size)
    old = {k: v.model_dump(exclude_defaults=True) for k, v in load_catalog("sglang", "0.5.5").limits.items()}
    moved = catalog_from_probe(dump, {}, old)
    assert "tp-size" in moved.limits and "tensor-parallel-size" not in moved.limits


def test_regeneration_command_keeps_the_limits(tmp_path: Path) -> None:
    """``python -m servetune.engines.catalog`` end to end; the interpreter replays the recorded dump (no SGLang
    here), so what runs is the real command: probe output in, catalogue with its hand-kept sections out."""
    replay = tmp_path / "sglang-python"
    replay.write_text(f"#!{sys.executable}\nimport json, lzma, sys\n"
                      f"sys.stdout.write(json.dumps(json.loads(lzma.decompress(open({str(PROBE)!r}, 'rb').read()))"
                      f"['catalog']))\n")
    replay.chmod(0o755)
    out = subprocess.run([sys.executable, "-m", "servetune.engines.catalog", "--python", str(replay),
                          "--out", str(tmp_path)], capture_output=True, text=True, check=True)
    assert f"{len(load_catalog('sglang', '0.5.17').limits)} limits" in out.stdout, out.stdout
    written = yaml.safe_load((tmp_path / "sglang-0.5.17.yaml").read_text())
    assert set(written["limits"]) == set(load_catalog("sglang", "0.5.17").limits)


def test_runner_catalogue_of_an_unshipped_version_inherits_the_limits(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner on a version servetune does not ship: its own parser's catalogue is cached with the nearest
    shipped catalogue's limits, and later plans for that version are checked against them."""
    monkeypatch.setenv("SERVETUNE_CATALOG_CACHE", str(tmp_path))
    recorded = lzma.decompress(PROBE.read_bytes()).decode().replace('"0.5.17"', '"0.5.18"')
    verdict = interpret_parser_check(0, recorded, "", "0.5.18")
    assert verdict.ok and verdict.version == "0.5.18"
    cfg = engine_from_cli("sglang", model="/m", version="0.5.18", sets=["chunked-prefill-size=4096"])
    adopt_runner_version(cfg, verdict)
    cached = tmp_path / "sglang-0.5.18.yaml"
    assert cached.is_file() and set(yaml.safe_load(cached.read_text())["limits"]) == set(
        load_catalog("sglang", "0.5.17").limits)
    assert catalog_for("sglang", "0.5.18").version == "0.5.18"
    with pytest.raises(FlagError, match=r"bad value 0 for --chunked-prefill-size \(sglang 0\.5\.18\): must be -1"):
        engine_from_cli("sglang", model="/m", version="0.5.18", sets=["chunked-prefill-size=0"])
    assert cache_runner_catalog(_probe_dump()) is None  # a shipped version: the shipped catalogue wins


def test_a_limit_must_name_a_flag_of_its_catalogue() -> None:
    dump = _probe_dump()
    with pytest.raises(ValueError, match="limits: no-such-flag not among the flags of sglang 0.5.17"):
        load_catalog("sglang", "0.5.17").model_validate(
            {**load_catalog("sglang", "0.5.17").model_dump(), "limits": {"no-such-flag": {"ge": 1, "note": "x"}}})
    assert "no-such-flag" not in catalog_from_probe(dump, {}, {"no-such-flag": {"ge": 1, "note": "x"}}).limits
