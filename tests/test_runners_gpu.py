"""On a real GPU (skipped without NVML): the preflight sees foreign GPU users, and teardown gives memory back.

Run on a GPU host: ``python -m pytest --noconftest tests/test_runners_gpu.py`` (needs torch there).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from fake_engines.helpers import fake_sglang, wait_all_gone
from servetune.runners import LocalRunnerConfig, check_clean, provision
from servetune.runners.preflight import MIB, free_port
from servetune.telemetry.nvml import GpuUnavailable, gpu_memory_used

try:
    gpu_memory_used([0])
except GpuUnavailable as exc:
    pytest.skip(f"no GPU: {exc}", allow_module_level=True)

pytest.importorskip("torch")
HOLD_GIB = 8
HOLDER = ("import sys, time, torch\n"
          f"x = torch.empty({HOLD_GIB} * 2**30, dtype=torch.uint8, device='cuda'); x.fill_(1)\n"
          "print('holding', flush=True)\n"
          "time.sleep(600)\n")


def test_idle_gpu_is_clean():
    report = check_clean(host="127.0.0.1", port=free_port(), gpus=[0])
    assert report.ok, report
    assert report.gpu.startswith("GPU 0: ") and report.details["gpu_available"]


def test_a_foreign_gpu_user_makes_the_environment_dirty():
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        report = check_clean(host="127.0.0.1", port=free_port(), gpus=[0], idle_mib=2048)
        assert not report.ok
        memory = [p for p in report.problems if "MiB in use" in p]
        assert memory, report  # memory is seen even where NVML cannot list processes (containers)
        print("preflight problems:", report.problems)
    finally:
        holder.kill()
        holder.wait()


def test_engine_holding_gpu_memory_is_torn_down_and_memory_released(tmp_path):
    before = gpu_memory_used([0])[0]
    runner = LocalRunnerConfig(gpus=[0], grace_s=10, gpu_release_timeout_s=60)
    t0 = time.monotonic()
    with provision(fake_sglang("ok", ready_timeout_s=120, FAKE_ENGINE_GPU_GIB=str(HOLD_GIB)), runner,
                   log_dir=tmp_path) as server:
        during = gpu_memory_used([0])[0]
        assert during - before >= HOLD_GIB * 1024 * MIB * 0.9, (before, during)
        assert server.preflight().ok, server.preflight()  # the engine's own memory use is not "foreign"
        pid = server.pid
    report = server.handle.teardown_report
    after = gpu_memory_used([0])[0]
    print(f"GPU 0 MiB before {before / MIB:.0f}, serving {during / MIB:.0f}, after teardown {after / MIB:.0f}; "
          f"teardown {report.seconds:.2f} s, whole lifecycle {time.monotonic() - t0:.1f} s; {report}")
    assert report.clean and report.gpu == "released", report
    assert after <= before + 256 * MIB
    assert wait_all_gone([pid], 5) == []
