"""``servetune serve``: dry runs print the exact command; a real run serves until SIGINT and tears down."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys

import psutil
import pytest
import yaml
from typer.testing import CliRunner

from fake_engines.helpers import wait_all_gone
from servetune.cli import app
from servetune.runners.base import KubernetesRunnerConfig
from servetune.runners.kubernetes import ManifestError, build_manifests, validate_manifest

cli = CliRunner()


def test_dry_run_prints_the_exact_sglang_argv():
    """Two GPUs: both visible, and NVLink multicast kept off (NCCL NVLS, torch symmetric memory, NVSHMEM)."""
    r = cli.invoke(app, ["serve", "--engine", "sglang", "--model", "/models/llama", "--set", "max-running-requests=64",
                         "--set", "schedule-policy=lpm", "--gpus", "0,1", "--port", "30123", "--dry-run"])
    assert r.exit_code == 0, r.output
    assert shlex.split(r.stdout) == [
        "env", "CUDA_VISIBLE_DEVICES=0,1", "NCCL_NVLS_ENABLE=0", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1",
        "NVSHMEM_DISABLE_NVLS=1", "python3", "-m", "sglang.launch_server", "--model-path", "/models/llama",
        "--host", "127.0.0.1", "--port", "30123", "--enable-metrics", "--enable-cache-report",
        "--max-running-requests", "64", "--schedule-policy", "lpm"]


def test_dry_run_rejects_a_removed_flag_naming_it_and_the_version():
    r = cli.invoke(app, ["serve", "--engine", "sglang", "--model", "/m", "--set", "cuda-graph-max-bs=8", "--dry-run"])
    assert r.exit_code == 2
    assert "unknown flag --cuda-graph-max-bs for sglang 0.5.23 (removed in 0.5.20" in r.output


def test_no_version_named_types_the_flags_for_the_sglang_that_python_imports(tmp_path, monkeypatch):
    """A local install of 0.5.17 (its package metadata on the path): its flag set, not the newest's."""
    info = tmp_path / "sglang-0.5.17.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.17\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    r = cli.invoke(app, ["serve", "--engine", "sglang", "--model", "/m", "--python", sys.executable,
                         "--set", "cuda-graph-max-bs=8", "--dry-run"])
    assert r.exit_code == 0, r.output
    assert shlex.split(r.stdout)[-2:] == ["--cuda-graph-max-bs", "8"]


def test_dry_run_does_not_check_paths_on_the_runner():
    r = cli.invoke(app, ["serve", "--engine", "vllm", "--model", "/no/such/model", "--set", "max-num-seqs=8",
                         "--dry-run", "--port", "8001"])
    assert r.exit_code == 0 and "--model /no/such/model" in r.stdout and "--max-num-seqs 8" in r.stdout


def test_ssh_dry_run_shows_the_forward_and_the_remote_command():
    r = cli.invoke(app, ["serve", "--engine", "sim", "--runner", "ssh", "--ssh-host", "gpu-7", "--ssh-user", "bench",
                         "--port", "9000", "--dry-run"])
    assert r.exit_code == 0, r.output
    argv = shlex.split(r.stdout)
    assert argv[0] == "ssh" and "BatchMode=yes" in argv and "-L" in argv
    assert argv[argv.index("-L") + 1] == "127.0.0.1:9000:127.0.0.1:30000" and "bench@gpu-7" in argv
    remote = shlex.split(argv[-1])
    assert remote[:4] == ["setsid", "-w", "sh", "-c"] and "sim" in remote and "--port" in remote


def test_kubernetes_dry_run_prints_a_valid_pod_and_service():
    r = cli.invoke(app, ["serve", "--engine", "sglang", "--model", "/models/llama", "--set", "max-running-requests=32",
                         "--runner", "kubernetes", "--gpus", "0,1", "--dry-run"])
    assert r.exit_code == 0, r.output
    pod, svc = list(yaml.safe_load_all(r.stdout))
    c = pod["spec"]["containers"][0]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/health_generate", "port": "http"}
    assert c["command"][:3] == ["python3", "-m", "sglang.launch_server"] and "--max-running-requests" in c["command"]
    assert c["command"][c["command"].index("--host") + 1] == "0.0.0.0"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert svc["kind"] == "Service" and svc["spec"]["ports"][0]["port"] == 30000
    assert cli.invoke(app, ["serve", "--engine", "sim", "--runner", "kubernetes"]).exit_code == 2  # manifests only


def test_manifest_validation_names_the_missing_field():
    from servetune.engines import SGLangConfig

    pod = build_manifests(SGLangConfig(model="/m"), KubernetesRunnerConfig(service=False))[0]
    del pod["spec"]["containers"][0]["readinessProbe"]
    try:
        validate_manifest(pod)
    except ManifestError as exc:
        assert "Pod/servetune-engine: container engine needs an httpGet readiness probe" in str(exc)
    else:
        raise AssertionError("a Pod without a readiness probe passed validation")


def test_serve_runs_the_sim_until_sigint_and_tears_down(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "servetune", "serve", "--engine", "sim", "--set",
                             "max-running-requests=4", "--log-dir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200", "PYTHONFAULTHANDLER": "1"})
    tree: list[psutil.Process] = []  # the engine's processes (psutil refuses to signal a reused pid)
    passed = False
    try:
        line = proc.stdout.readline()
        assert line.startswith("ready: http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() else "")
        pid = int(line.split("pid ")[1].split(",")[0])
        tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        engine = [p.pid for p in tree]
        proc.send_signal(signal.SIGINT)
        try:
            # the teardown's own waits add up to ~45 s at worst; a busy machine stretches them
            _, err = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's Python stack
            try:
                out, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            alive = [p.pid for p in tree if p.is_running()]
            logs = {f.name: f.read_text(errors="replace")[-2000:] for f in tmp_path.iterdir() if f.is_file()}
            pytest.fail(f"serve did not exit 150 s after SIGINT; engine pids alive: {alive}\n"
                        f"stdout: {out[-3000:]}\nstderr (stacks): {err[-8000:]}\nlogs: {logs}")
        assert proc.returncode == 0, err
        assert "teardown: clean (signals SIGTERM" in err
        assert wait_all_gone(engine, 5) == []
        passed = True
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in tree if not passed else ():  # what a failed teardown left behind
            with contextlib.suppress(psutil.Error):
                p.kill()
