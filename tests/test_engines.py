"""Engine configs: flags typed and checked per SGLang version before any GPU is touched; failure classification."""

from __future__ import annotations

import os
import sys

import pytest

from servetune.engines import (
    EngineFailure,
    ExternalConfig,
    FailureKind,
    FlagError,
    SGLangConfig,
    VLLMConfig,
    classify,
    engine_from_cli,
    parse_engine_config,
)
from servetune.engines.catalog import available_versions, load_catalog
from servetune.engines.sglang import check_with_installed_parser, interpret_parser_check


def test_catalogues_generated_from_sglang_are_present():
    assert {"0.5.5", "0.5.15", "0.5.23"} <= set(available_versions("sglang"))
    cat = load_catalog("sglang", "0.5.23")
    assert len(cat.flags) > 400 and cat.allow_abbrev
    assert cat.flags["schedule-policy"].choices[:3] == ["lpm", "random", "fcfs"]
    assert cat.flags["max-running-requests"].type == "int"
    assert cat.flags["disable-radix-cache"].type == "bool"
    assert cat.canonical("--model") == "model-path" and cat.canonical("tp_size") == "tp-size"


def test_cuda_graph_max_bs_across_versions():
    """A real flag in 0.5.5, a deprecated alias in 0.5.15, gone (ambiguous) since 0.5.20."""
    old = engine_from_cli("sglang", model="/m", version="0.5.5", sets=["cuda-graph-max-bs=64"])
    assert old.launch_argv(host="h", port=1)[-2:] == ["--cuda-graph-max-bs", "64"]
    mid = load_catalog("sglang", "0.5.15").flags["cuda-graph-max-bs"]
    assert mid.deprecated and mid.replacement == "cuda-graph-max-bs-decode"
    with pytest.raises(FlagError) as err:
        engine_from_cli("sglang", model="/m", sets=["cuda-graph-max-bs=64"])
    assert str(err.value) == ("unknown flag --cuda-graph-max-bs for sglang 0.5.23 "
                              "(removed in 0.5.20; use --cuda-graph-max-bs-decode)")
    with pytest.raises(FlagError,
                       match=r"unknown flag --cuda-graph-bs for sglang 0.5.23 \(present in sglang 0.5.1[57]"):
        engine_from_cli("sglang", model="/m", sets=["cuda-graph-bs=1,2"])


@pytest.mark.parametrize(("pair", "message"), [
    ("max-running-requests=abc", "bad value 'abc' for --max-running-requests (sglang 0.5.23): expected an integer"),
    ("mem-fraction-static=lots", "bad value 'lots' for --mem-fraction-static (sglang 0.5.23)"),
    ("schedule-policy=fastest", "bad value 'fastest' for --schedule-policy (sglang 0.5.23): expected one of lpm"),
    ("disable-radix-cache=maybe", "expected true/false"),
    ("no-such-flag=1", "unknown flag --no-such-flag for sglang 0.5.23"),
    ("port=8000", "--port is set by servetune"),
    ("enable-metrics=false", "--enable-metrics cannot be turned off"),
    ("preferred-sampling-params={bad", "bad value '{bad' for --preferred-sampling-params"),
    ("max-running-requests", "--set expects key=value"),
])
def test_bad_flags_are_rejected_naming_the_flag_and_version(pair, message):
    with pytest.raises(FlagError) as err:
        engine_from_cli("sglang", model="/m", sets=[pair])
    assert message in str(err.value)


def test_sglang_argv_is_typed_and_always_reports_metrics_and_cache():
    cfg = engine_from_cli("sglang", model="/models/llama", sets=[
        "max_running_requests=64", "--schedule-policy=lpm", "disable-radix-cache=true", "enable-mixed-chunk=false",
        "cuda-graph-bs-decode=1,2,4", "mem-fraction-static=0.85"])
    assert cfg.args["max-running-requests"] == 64 and cfg.args["mem-fraction-static"] == 0.85
    assert cfg.launch_argv(host="127.0.0.1", port=30001) == [
        "python3", "-m", "sglang.launch_server", "--model-path", "/models/llama", "--host", "127.0.0.1",
        "--port", "30001", "--enable-metrics", "--enable-cache-report", "--max-running-requests", "64",
        "--schedule-policy", "lpm", "--disable-radix-cache", "--cuda-graph-bs-decode", "1", "2", "4",
        "--mem-fraction-static", "0.85"]
    assert cfg.health_paths == ("/health_generate",) and cfg.info_paths[0] == "/server_info"


def test_plan_yaml_values_keep_their_types():
    cfg = parse_engine_config({"kind": "sglang", "model": "/m", "args": {"max-running-requests": 8,
                                                                      "chunked-prefill-size": 4096.0}})
    assert cfg.args == {"max-running-requests": 8, "chunked-prefill-size": 4096}
    with pytest.raises(ValueError, match="expected an integer"):
        parse_engine_config({"kind": "sglang", "model": "/m", "args": {"max-running-requests": True}})
    newer = parse_engine_config({"kind": "sglang", "model": "/m", "version": "9.9.9",
                                 "args": {"mem-fraction-static": 0.8}})
    assert newer.catalog.version == available_versions("sglang")[-1]  # the nearest shipped, said in every message
    with pytest.raises(ValueError,
                       match=r"unknown flag --no-such-flag for sglang 0\.5\.\d+, the catalogue nearest 9\.9\.9"):
        parse_engine_config({"kind": "sglang", "model": "/m", "version": "9.9.9", "args": {"no-such-flag": 1}})


def test_vllm_knobs():
    cfg = engine_from_cli("vllm", model="/m", sets=["max-num-seqs=16", "max-num-batched-tokens=4096",
                                                    "enable-prefix-caching=false"])
    assert cfg.launch_argv(host="127.0.0.1", port=8000) == [
        "python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--host", "127.0.0.1",
        "--port", "8000", "--max-num-seqs", "16", "--max-num-batched-tokens", "4096",
        "--no-enable-prefix-caching", "--enable-prompt-tokens-details"]
    with pytest.raises(FlagError, match="--max-num-seqs: Input should be a valid integer"):
        engine_from_cli("vllm", model="/m", sets=["max-num-seqs=many"])
    with pytest.raises(FlagError, match="unknown flag --block-size for vllm"):
        engine_from_cli("vllm", model="/m", sets=["block-size=32"])
    assert VLLMConfig(model="/m").health_paths == ("/health",)


def test_sim_speaks_sglang_flags_it_models():
    cfg = engine_from_cli("sim", model="llama-3.1-70b", sets=["max-running-requests=32", "schedule-policy=lpm"],
                          gpu_profile="H200")
    argv = cfg.launch_argv(host="127.0.0.1", port=1234)
    assert argv[:5] == [sys.executable, "-m", "servetune", "sim", "serve"]
    assert argv[5:] == ["--model-profile", "llama-3.1-70b", "--gpu-profile", "H200", "--host", "127.0.0.1",
                        "--port", "1234", "--enable-metrics", "--enable-cache-report", "--max-running-requests",
                        "32", "--schedule-policy", "lpm"]
    with pytest.raises(FlagError, match="--enable-mixed-chunk is an SGLang flag the simulator does not model"):
        engine_from_cli("sim", model=None, sets=["enable-mixed-chunk=true"])
    with pytest.raises(FlagError, match="invalid choice: 'random'"):
        engine_from_cli("sim", model=None, sets=["schedule-policy=random"])  # real SGLang, not modelled


def test_external_is_not_launched():
    cfg = engine_from_cli("external", model=None, sets=[], url="http://10.0.0.5:30000/")
    assert isinstance(cfg, ExternalConfig) and not cfg.launches and cfg.url == "http://10.0.0.5:30000"
    with pytest.raises(FlagError, match="takes no --set"):
        engine_from_cli("external", model=None, sets=["a=1"], url="http://x:1")
    with pytest.raises(FlagError, match="url must be http"):
        engine_from_cli("external", model=None, sets=[], url="ftp://x")


@pytest.mark.parametrize(("lines", "kind"), [
    (["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"], FailureKind.cuda_oom),
    (["RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."], FailureKind.cuda_oom),
    (["ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`"],
     FailureKind.cuda_oom),
    (["OSError: [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address already in use"],
     FailureKind.port_in_use),
    (["launch_server.py: error: unrecognized arguments: --cuda-graph-max-bs 8"], FailureKind.bad_flag),
    (["launch_server.py: error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode"],
     FailureKind.bad_flag),
    (["OSError: /models/x does not appear to have a file named config.json."], FailureKind.model_missing),
    (["huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name'"], FailureKind.model_missing),
    (["INFO loading weights", "Killed"], None),
])
def test_failure_classification(lines, kind):
    assert classify(lines) is kind


def test_engine_failure_carries_kind_reason_and_tail():
    e = EngineFailure(FailureKind.timeout, "not ready after 5 s", ["a", "b"], "/tmp/x.log")
    assert str(e) == "timeout: not ready after 5 s"
    assert e.details().endswith("--- last 2 log lines ---\na\nb") and "(log: /tmp/x.log)" in e.details()
    refused = EngineFailure(FailureKind.dirty_environment, "port 1 on 127.0.0.1 is already in use", [])
    assert refused.details() == "dirty_environment: port 1 on 127.0.0.1 is already in use"  # no empty log block


def test_parser_verdicts():
    ok = interpret_parser_check(0, '{"ok": true, "version": "0.5.23"}\n', "", "0.5.23")
    assert ok.checked and ok.ok
    bad = interpret_parser_check(2, '{"ok": false, "version": "0.5.23", "error": "ambiguous option: --x"}', "",
                                 "0.5.23")
    assert bad.checked and not bad.ok and bad.error == "ambiguous option: --x"
    other = interpret_parser_check(0, '{"ok": true, "version": "0.5.24"}', "", "0.5.23")
    assert other.ok and other.version == "0.5.24" and "the runner has 0.5.24: its own parser checked" in other.note
    unplanned = interpret_parser_check(0, '{"ok": true, "version": "0.5.24"}', "", None)
    assert unplanned.ok and unplanned.note is None
    missing = interpret_parser_check(1, "", "ModuleNotFoundError: No module named 'sglang'", "0.5.23")
    assert not missing.checked and missing.note == "sglang is not installed there"


SGLANG_PYTHON = os.environ.get("SERVETUNE_SGLANG_PYTHON")


@pytest.mark.skipif(not SGLANG_PYTHON, reason="set SERVETUNE_SGLANG_PYTHON to an interpreter with sglang installed")
def test_sglangs_own_parser_agrees_with_the_catalogue():
    """Where SGLang is installed: its parser accepts what the catalogue accepts and rejects the removed flag."""
    good = SGLangConfig(model="/m", python=SGLANG_PYTHON, version=os.environ.get("SERVETUNE_SGLANG_VERSION", "0.5.23"),
                        args={"max-running-requests": 64, "schedule-policy": "lpm", "cuda-graph-bs-decode": [1, 2]})
    verdict = check_with_installed_parser(good)
    assert verdict.checked and verdict.ok, verdict
    stale = good.model_copy(update={"args": {}, "version": good.version})
    argv = stale.parser_check_argv(host="127.0.0.1", port=1) + ["--cuda-graph-max-bs", "8"]
    import subprocess

    proc = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    verdict = interpret_parser_check(proc.returncode, proc.stdout, proc.stderr, good.version)
    assert verdict.checked and not verdict.ok and "ambiguous option: --cuda-graph-max-bs" in verdict.error


def test_flags_read_as_typed_store_true_bare() -> None:
    from servetune.engines.catalog import command_text

    flags = {"disable-cuda-graph": True, "chunked-prefill-size": 4096, "disable-radix-cache": False,
             "max-running-requests": None}
    assert command_text(flags) == "--disable-cuda-graph --chunked-prefill-size 4096"
