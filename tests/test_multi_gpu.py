"""Several GPUs for one server (data or tensor parallel), on the CPU side: the runner passes every GPU,
the plan names as many GPUs as the engine occupies, and the engine's environment keeps NVLink multicast
off on every runner (local, SSH, Kubernetes). The measurement itself needs a two-GPU host (docs/gpu.md)."""

from __future__ import annotations

import pytest

from servetune.engines import SGLangConfig
from servetune.plan import PlanError, parse_plan
from servetune.runners.base import MULTI_GPU_ENV, KubernetesRunnerConfig, SSHRunnerConfig, gpu_env
from servetune.runners.kubernetes import build_manifests
from servetune.runners.ssh import SSHBackend

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def test_two_gpus_are_visible_and_keep_multicast_off_one_gpu_does_not_need_to() -> None:
    assert MULTI_GPU_ENV == MULTICAST_OFF
    assert gpu_env([0, 1], {}) == {"CUDA_VISIBLE_DEVICES": "0,1", **MULTICAST_OFF}
    assert gpu_env([3], {"X": "1"}) == {"X": "1", "CUDA_VISIBLE_DEVICES": "3"}
    assert gpu_env(None, {}) == {}
    # the plan's own env wins: someone who has multicast working may turn it on
    assert gpu_env([0, 1], {"NCCL_NVLS_ENABLE": "1"})["NCCL_NVLS_ENABLE"] == "1"


def test_the_ssh_runner_sends_the_same_environment() -> None:
    runner = SSHBackend(SSHRunnerConfig(host="gpu-host", gpus=[0, 1]))
    env = runner.engine_env({"HF_HUB_OFFLINE": "1"})
    assert env == {"HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "0,1", **MULTICAST_OFF}


def test_a_two_gpu_pod_asks_for_both_and_keeps_multicast_off() -> None:
    engine = SGLangConfig(model="/models/m", args={"dp-size": 2})
    pod = next(m for m in build_manifests(engine, KubernetesRunnerConfig(gpus=2)) if m["kind"] == "Pod")
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert MULTICAST_OFF.items() <= env.items()
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert container["command"][-2:] == ["--dp-size", "2"]


def _plan(args: dict, gpus: list[int]):
    return parse_plan({
        "name": "dp-vs-tp", "model": "/models/m",
        "engine": {"kind": "sglang", "model": "/models/m", "version": "0.5.17", "args": args},
        "runner": {"kind": "local", "gpus": gpus},
        "workload": {"input": {"kind": "fixed", "value": 512}, "output": {"kind": "fixed", "value": 128}},
        "sla": {"p99_ttft_ms": 1500, "p99_tpot_ms": 25},
        "stages": {"refine": {"enabled": False}},
    }, source="dp-vs-tp plan")


@pytest.mark.parametrize("args", [{"dp-size": 2}, {"tp-size": 2}, {"tp-size": 1, "dp-size": 2}])
def test_a_plan_for_two_gpus_names_both(args) -> None:
    plan = _plan(args, [0, 1])
    assert plan.engine.gpus_needed() == 2 and plan.runner.gpus == [0, 1]


def test_a_plan_naming_fewer_gpus_than_its_ranks_is_refused_before_any_gpu_is_touched() -> None:
    with pytest.raises(PlanError, match=r"runner.gpus: 1 GPU\(s\) for an engine that occupies 4 \(tp-size x dp-size\)"):
        _plan({"tp-size": 2, "dp-size": 2}, [0])


def test_both_runner_backends_declare_the_one_interface() -> None:
    """The lifecycle calls a declared interface (runners.backend.RunnerBackend), never probes with hasattr."""
    import inspect

    from servetune.runners import lifecycle
    from servetune.runners.backend import RunnerBackend
    from servetune.runners.base import LocalRunnerConfig
    from servetune.runners.local import LocalBackend

    for backend in (LocalBackend(LocalRunnerConfig(gpus=[0, 1])), SSHBackend(SSHRunnerConfig(host="h"))):
        assert isinstance(backend, RunnerBackend), type(backend).__name__
    assert "hasattr" not in inspect.getsource(lifecycle)
    assert LocalBackend(LocalRunnerConfig()).tail(5) == []  # nothing launched: no log yet
