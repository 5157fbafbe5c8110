"""The local lifecycle for real: start, readiness, one request, teardown, and nothing left behind.

Failure injection uses tests/fake_engines (a fake ``sglang.launch_server`` launched through the real
SGLang argv path); the happy path uses the simulated engine (``servetune sim serve``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.request

import pytest

from fake_engines.helpers import alive, fake_sglang, tree, wait_all_gone, worker_pids
from servetune.engines import EngineFailure, ExternalConfig, FailureKind, SimConfig
from servetune.runners import LocalRunnerConfig, Server, check_clean, provision
from servetune.runners.preflight import free_port
from servetune.telemetry.nvml import GpuUnavailable, gpu_memory_used


def post_json(url: str, body: dict, timeout: float = 30) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


@pytest.fixture
def runner() -> LocalRunnerConfig:
    return LocalRunnerConfig(grace_s=5, poll_interval_s=0.1)


def test_sim_lifecycle_start_request_teardown(runner, tmp_path):
    engine = SimConfig(load_seconds=0.3, args={"max-running-requests": 8})
    with provision(engine, runner, log_dir=tmp_path) as server:
        pids = tree(server.pid)
        assert server.url == f"http://127.0.0.1:{server.port}"
        assert server.argv[:5] == [sys.executable, "-m", "servetune", "sim", "serve"]
        assert {"--enable-metrics", "--enable-cache-report"} <= set(server.argv)
        assert server.resolved_args["max_running_requests"] == 8  # read back from /server_info
        out = post_json(server.url + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 3}})
        assert out["meta_info"]["completion_tokens"] == 3
        assert server.log_path.is_file() and server.log_path.parent == tmp_path
        server.check_alive()
    report = server.handle.teardown_report
    assert report.clean, report
    assert report.signals == ["SIGTERM"] and report.port_free is True
    assert report.gpu.startswith("no GPU") or report.gpu == "released"  # without NVML: said, not hidden
    assert wait_all_gone(pids, 5) == []


def test_explicit_api_and_running_preflight(runner, tmp_path):
    server = Server(fake_sglang("ok", FAKE_ENGINE_WORKERS="2"), runner, log_dir=tmp_path).start()
    try:
        running = server.wait_ready()
        workers = worker_pids(running.tail_log())
        assert len(workers) == 2 and alive(workers) == workers
        assert "api_key" not in running.resolved_args  # secrets never leave the server info
        assert running.resolved_args["port"] == running.port
        pre = running.preflight()
        assert pre.ok and pre.gpu.startswith("no GPU")
    finally:
        report = server.stop()
    assert report.clean, report
    assert wait_all_gone([running.pid, *workers], 5) == []
    assert server.stop() is report  # idempotent


def test_cuda_oom_at_start_is_classified_with_the_log_tail(runner, tmp_path):
    with pytest.raises(EngineFailure) as err:
        with provision(fake_sglang("oom"), runner, log_dir=tmp_path):
            pass
    e = err.value
    assert e.kind is FailureKind.cuda_oom
    assert "CUDA out of memory" in e.reason and "exited with code 1" in e.reason
    assert any("OutOfMemoryError" in line for line in e.log_tail) and len(e.log_tail) <= 50


def test_never_ready_times_out_and_is_torn_down(runner, tmp_path):
    server = Server(fake_sglang("never_ready", ready_timeout_s=1.5, FAKE_ENGINE_WORKERS="1"), runner,
                    log_dir=tmp_path).start()
    with pytest.raises(EngineFailure) as err:
        server.wait_ready()
    assert err.value.kind is FailureKind.timeout and "not ready after 1.5 s" in err.value.reason
    assert server.teardown_report is not None and server.teardown_report.clean
    assert wait_all_gone([server.backend.pid, *worker_pids(server.tail_log())], 5) == []


def test_engine_dying_mid_trial_is_reported_and_torn_down(runner, tmp_path):
    with provision(fake_sglang("die_mid", FAKE_ENGINE_WORKERS="1"), runner, log_dir=tmp_path) as server:
        workers = worker_pids(server.tail_log())
        with pytest.raises(OSError):  # the request that kills it gets no answer
            post_json(server.url + "/generate", {"text": "x"}, timeout=10)
        server.handle.backend.process.proc.wait(timeout=10)
        with pytest.raises(EngineFailure) as err:
            server.check_alive()
        assert err.value.kind is FailureKind.died and "exited with code 3 while serving" in err.value.reason
        assert any("simulated crash" in line for line in err.value.log_tail)
    assert server.handle.teardown_report.clean
    assert wait_all_gone(workers, 5) == []  # the dead leader's worker was still killed


def test_port_already_bound_fails_preflight_without_starting(runner, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(EngineFailure) as err:
            with provision(fake_sglang("ok"), runner, port=port, log_dir=tmp_path):
                pass
        assert err.value.kind is FailureKind.dirty_environment
        assert f"port {port} on 127.0.0.1 is already in use" in err.value.reason
        assert list(tmp_path.iterdir()) == []  # nothing was launched


def test_port_taken_after_preflight_is_classified_from_the_log(tmp_path):
    runner = LocalRunnerConfig(check_clean=False, grace_s=2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(EngineFailure) as err:
            with provision(fake_sglang("port_in_use"), runner, port=s.getsockname()[1], log_dir=tmp_path):
                pass
    assert err.value.kind is FailureKind.port_in_use


@pytest.mark.parametrize(("mode", "kind", "needle"), [
    ("bad_flag", FailureKind.bad_flag, "unrecognized arguments: --not-in-this-version"),
    ("model_missing", FailureKind.model_missing, "does not appear to have a file named config.json"),
])
def test_start_failures_are_classified(runner, tmp_path, mode, kind, needle):
    with pytest.raises(EngineFailure) as err:
        Server(fake_sglang(mode), runner, log_dir=tmp_path).wait_ready()
    assert err.value.kind is kind and needle in err.value.reason


def test_sigterm_ignored_escalates_to_sigkill_and_escaped_workers_are_swept(tmp_path):
    runner = LocalRunnerConfig(grace_s=1, poll_interval_s=0.1)
    with provision(fake_sglang("ignore_term", FAKE_ENGINE_WORKERS="1", FAKE_ENGINE_ESCAPE="1"), runner,
                   log_dir=tmp_path) as server:
        workers = worker_pids(server.tail_log())
        assert len(workers) == 2
        escaped = workers[-1]
        assert os.getpgid(escaped) != server.pid  # it really left the engine's process group
    report = server.handle.teardown_report
    assert report.signals == ["SIGTERM", "SIGKILL"] and report.clean, report
    assert wait_all_gone([server.pid, *workers], 5) == []


PARENT = textwrap.dedent("""
    import json, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    from fake_engines.helpers import fake_sglang, tree
    from servetune.runners import LocalRunnerConfig, provision

    def trial():
        escape = {"FAKE_ENGINE_ESCAPE": "1"} if sys.argv[4] == "escape" else {}  # a worker in its own session
        with provision(fake_sglang("ok", FAKE_ENGINE_WORKERS="2", **escape), LocalRunnerConfig(grace_s=2),
                       log_dir=sys.argv[2]) as s:
            print(json.dumps(tree(s.pid)), flush=True)
            time.sleep(600)

    if sys.argv[3] == "thread":  # no PR_SET_PDEATHSIG there: the watchdog alone must do it
        t = threading.Thread(target=trial)
        t.start()
        t.join()
    else:
        trial()
""")


@pytest.mark.parametrize(("where", "workers"), [("main", "group"), ("thread", "group"), ("main", "escape")])
def test_parent_killed_mid_trial_leaves_no_engine_process(tmp_path, where, workers):
    """SIGKILL to the process running provision(): no finally runs, yet the engine's whole tree must die,
    a worker that left the engine's process group (its own session) included."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, os.path.dirname(__file__), str(tmp_path), where,
                               workers], stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(parent.stdout.readline())
        assert len(pids) >= (4 if workers == "escape" else 3) and alive(pids) == pids  # leader + workers serving
        if workers == "escape":
            assert os.getsid(pids[-1]) == pids[-1] != os.getpgid(pids[0])
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert wait_all_gone(pids, 15) == []
    finally:
        if parent.poll() is None:
            parent.kill()


def test_preflight_says_whether_it_saw_a_gpu_and_always_checks_the_port():
    port = free_port()
    report = check_clean(host="127.0.0.1", port=port, gpus=[0])
    assert report.port == f"127.0.0.1:{port} free"
    try:
        gpu_memory_used([0])
    except GpuUnavailable:  # this CI machine: said explicitly, never reported as a clean GPU
        assert report.ok and report.gpu.startswith("no GPU (") and report.details == {"gpu_available": False}
    else:  # a GPU host (tests/test_runners_gpu.py covers dirty GPUs)
        assert report.gpu.startswith("GPU 0: ") and report.details["gpu_available"]


def test_external_endpoint_is_measured_not_launched(tmp_path):
    with provision(fake_sglang("ok"), LocalRunnerConfig(grace_s=2), log_dir=tmp_path) as real:
        with provision(ExternalConfig(url=real.url, model="m"), log_dir=tmp_path) as ext:
            assert ext.url == real.url and ext.pid is None and ext.model == "m"
            assert ext.resolved_args["model_path"] == "/models/fake"
        assert ext.handle.teardown_report.gpu == "not ours"
        real.check_alive()  # tearing down the external "server" did not touch the real one
