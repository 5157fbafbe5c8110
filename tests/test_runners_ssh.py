"""The SSH runner against a real sshd on 127.0.0.1 (host key, client key and authorized_keys made here).

"Remote" is this machine, so the tests can look at the remote processes with psutil directly.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from fake_engines.helpers import fake_sglang, wait_all_gone, worker_pids
from servetune.engines import EngineFailure, FailureKind, SimConfig
from servetune.runners import SSHRunnerConfig, provision
from servetune.runners.preflight import free_port

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def _wait_listening(port: int, proc: subprocess.Popen, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("sshd did not listen in time")


@pytest.fixture(scope="module")
def ssh_runner(tmp_path_factory) -> SSHRunnerConfig:
    if not os.path.exists(SSHD):
        pytest.skip("sshd not found (install openssh-server: bash scripts/system-deps.sh)")
    d = tmp_path_factory.mktemp("sshd")
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    (d / "authorized_keys").chmod(0o600)
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    port = free_port()
    (d / "sshd_config").write_text(textwrap.dedent(f"""
        Port {port}
        ListenAddress 127.0.0.1
        HostKey {d}/host_key
        PidFile {d}/sshd.pid
        AuthorizedKeysFile {d}/authorized_keys
        PubkeyAuthentication yes
        PasswordAuthentication no
        KbdInteractiveAuthentication no
        UsePAM no
        StrictModes no
        PermitRootLogin prohibit-password
        AllowTcpForwarding yes
        LogLevel ERROR
    """))
    host_pub = (d / "host_key.pub").read_text().split()
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    with (d / "sshd.log").open("wb") as log:
        sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stdout=log, stderr=log,
                                start_new_session=True)
    try:
        _wait_listening(port, sshd)
        yield SSHRunnerConfig(host="127.0.0.1", ssh_port=port, user=getpass.getuser(),
                              identity_file=d / "client_key", known_hosts_file=d / "known_hosts",
                              remote_python=sys.executable, grace_s=3, poll_interval_s=0.2)
    finally:
        sshd.terminate()
        sshd.wait(timeout=10)


def group_of(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    return out


def test_sim_over_ssh_serves_through_the_forward_and_is_torn_down(ssh_runner, tmp_path):
    with provision(SimConfig(load_seconds=0.3, args={"max-running-requests": 4}), ssh_runner, log_dir=tmp_path) as s:
        remote_port = s.handle.backend.remote_port
        assert s.url == f"http://127.0.0.1:{s.port}" and s.port != remote_port  # through the local forward
        assert s.resolved_args["max_running_requests"] == 4 and s.resolved_args["port"] == remote_port
        req = urllib.request.Request(s.url + "/generate", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 2}}).encode())
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert json.loads(resp.read())["meta_info"]["completion_tokens"] == 2
        members = group_of(s.pid)  # s.pid is the remote PGID
        assert members and any("sim serve" in " ".join(psutil.Process(p).cmdline()) for p in members)
        ssh_client = s.handle.backend.process.pid
    report = s.handle.teardown_report
    assert report.clean, report
    assert report.port_free is True and report.gpu.startswith("no GPU")
    assert wait_all_gone([*members, ssh_client], 10) == []


def test_oom_over_ssh_is_classified_from_the_streamed_log(ssh_runner, tmp_path):
    with pytest.raises(EngineFailure) as err:
        with provision(fake_sglang("oom"), ssh_runner, log_dir=tmp_path):
            pass
    assert err.value.kind is FailureKind.cuda_oom
    assert err.value.log_tail[0].startswith("servetune-remote-pgid ")


def test_remote_port_in_use_fails_the_preflight(ssh_runner, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        busy = ssh_runner.model_copy(update={"remote_port": port})
        with pytest.raises(EngineFailure) as err:
            with provision(fake_sglang("ok"), busy, log_dir=tmp_path):
                pass
    assert err.value.kind is FailureKind.dirty_environment
    assert f"port {port} on 127.0.0.1 is already in use" in err.value.reason


PARENT = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, sys.argv[1])
    from fake_engines.helpers import fake_sglang
    from servetune.runners import SSHRunnerConfig, provision
    runner = SSHRunnerConfig.model_validate_json(sys.argv[3])
    with provision(fake_sglang("ok", FAKE_ENGINE_WORKERS="1"), runner, log_dir=sys.argv[2]) as s:
        print(json.dumps({"pgid": s.pid, "log": str(s.log_path)}), flush=True)
        time.sleep(600)
""")


def test_local_parent_killed_mid_trial_tears_down_the_remote_group(ssh_runner, tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(Path(__file__).parent), str(tmp_path),
                               ssh_runner.model_dump_json()], stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(parent.stdout.readline())
        members = group_of(info["pgid"])
        workers = worker_pids(Path(info["log"]).read_text().splitlines())
        assert workers and set(workers) <= set(members)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert wait_all_gone(members, 20) == []  # ssh client killed -> remote stdin EOF -> group killed
    finally:
        if parent.poll() is None:
            parent.kill()
