"""`servetune demo` (the main job) and `servetune airflow env|standalone`.

These commands set up and drive a real Apache Airflow as a *subprocess*: the library never
imports Airflow (the servetune_airflow package is the Airflow side). The environment they build points
Airflow at that package's DAG files, a PostgreSQL metadata database and the warehouse connection
``servetune_warehouse``, with example DAGs off and servers bound to loopback.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import typer
from rich.console import Console
from rich.markup import escape

from servetune.commands.jsonout import JsonFlag, use_json
from servetune.commands.outcome import outcome_document, print_outcome
from servetune.experiment import ResultFolder
from servetune.gpu_pools import runner_pools


def _make_url(url: str) -> Any:
    """sqlalchemy's URL parser, imported on use: a GPU runner's `servetune tune` needs no database driver."""
    from sqlalchemy.engine import make_url

    return make_url(url)


def _localdb() -> Any:
    from servetune import localdb

    return localdb


REPO = Path(__file__).resolve().parents[2]
console = Console()
_err = Console(stderr=True)  # --json: the human text, stdout holding the document alone


def dags_folder() -> Path:
    """The installed servetune_airflow package's DAG files, found without importing it (the library never does)."""
    import importlib.util

    spec = importlib.util.find_spec("servetune_airflow")
    if spec is None or not spec.submodule_search_locations:
        raise typer.BadParameter("servetune_airflow is not installed: pip install 'servetune[airflow]'")
    return Path(list(spec.submodule_search_locations)[0]) / "dags"


@dataclass
class AirflowSetup:
    """Everything an Airflow subprocess needs to run servetune's DAGs against one Postgres."""

    home: Path
    metadata_url: str
    warehouse_url: str
    plans_dir: Path
    results_dir: Path
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. the Celery executor's settings
    paused: bool = True  # new DAGs start paused: a first start never runs last Monday's campaign by itself

    def env(self) -> dict[str, str]:
        meta = _make_url(self.metadata_url).set(drivername="postgresql+psycopg2")
        wh = _make_url(self.warehouse_url).set(drivername="postgresql")
        venv_bin = str(Path(sys.executable).parent)
        env = dict(os.environ)
        env.update({
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder()),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": str(self.paused),
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": meta.render_as_string(hide_password=False),
            "AIRFLOW__API__HOST": "127.0.0.1",
            # INFO: a task's log holds a line per trial and per stage (servetune_airflow/task_logs.py keeps library
            # chatter out)
            "AIRFLOW__LOGGING__LOGGING_LEVEL": os.environ.get("AIRFLOW__LOGGING__LOGGING_LEVEL", "INFO"),
            "AIRFLOW_CONN_SERVETUNE_WAREHOUSE": wh.render_as_string(hide_password=False),
            "SERVETUNE_PLANS_DIR": str(self.plans_dir),
            "SERVETUNE_RESULTS_DIR": str(self.results_dir),
            "PATH": venv_bin + os.pathsep + env.get("PATH", ""),
            "PYTHONPATH": str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
        })
        env.pop("SERVETUNE_DATABASE_URL", None)  # the DAGs read the Airflow connection
        env.update(self.extra_env)
        return env

    def airflow(self, *args: str, check: bool = True, quiet: bool = True) -> subprocess.CompletedProcess:
        exe = shutil.which("airflow", path=self.env()["PATH"])
        if exe is None:
            raise AirflowFailed("airflow: not installed in this environment (pip install -e '.[airflow]')")
        out = subprocess.PIPE if quiet else None
        proc = subprocess.run([exe, *args], env=self.env(), stdout=out, stderr=subprocess.STDOUT if quiet else None,
                              text=True, check=False)
        if check and proc.returncode != 0:
            raise AirflowFailed(f"`airflow {' '.join(args)}` failed (exit {proc.returncode})",
                                (proc.stdout or "").splitlines()[-40:])
        return proc


class AirflowFailed(RuntimeError):
    """An ``airflow`` subprocess that failed: a one-line headline, and the tail of its output."""

    def __init__(self, headline: str, tail: list[str] | None = None) -> None:
        super().__init__("\n".join([f"{headline}:" if tail else headline, *(tail or [])]))
        self.headline, self.tail = headline, tail or []


@contextmanager
def _airflow_errors() -> Iterator[None]:
    """Airflow's own output tail first (context), then our one ``error:`` line last; exit 1."""
    try:
        yield
    except AirflowFailed as exc:
        err = Console(stderr=True, soft_wrap=True, highlight=False)
        for line in exc.tail:
            err.print(f"  {escape(line)}", style="dim")
        err.print(f"[red]error:[/red] {escape(exc.headline)}")
        raise typer.Exit(1) from None


def _ensure_database(server_url: str, name: str) -> str:
    url = _make_url(server_url).set(database=name).render_as_string(hide_password=False)
    if not _localdb().answers(url):
        _localdb().create_database(server_url, name)
    return url


def setup_for(state_dir: Path, server_url: str, plans_dir: Path, results_dir: Path) -> AirflowSetup:
    """An AirflowSetup on the server's ``servetune_airflow`` and ``servetune`` databases (created if missing)."""
    return AirflowSetup(
        home=state_dir / "airflow",
        metadata_url=_ensure_database(server_url, "servetune_airflow"),
        warehouse_url=_ensure_database(server_url, "servetune"),
        plans_dir=plans_dir,
        results_dir=results_dir,
    )


def prepare(setup: AirflowSetup) -> AirflowSetup:
    """Migrate both databases, then register the DAGs and pools."""
    return register_dags(prepare_databases(setup))


def prepare_databases(setup: AirflowSetup) -> AirflowSetup:
    """Migrate both databases: Alembic for the warehouse, Airflow's own migration for its metadata."""
    from servetune.warehouse import migrate

    setup.home.mkdir(parents=True, exist_ok=True)
    migrate.upgrade(setup.warehouse_url)
    setup.airflow("db", "migrate")
    return setup


def register_dags(setup: AirflowSetup) -> AirflowSetup:
    """On migrated databases: every DAG serialized with this setup's plans, and the GPU pools created."""
    setup.home.mkdir(parents=True, exist_ok=True)
    setup.results_dir.mkdir(parents=True, exist_ok=True)
    setup.airflow("dags", "reserialize")  # every DAG known to the DB, with its asset schedule
    for pool, slots, what in runner_pools(setup.plans_dir):  # one slot each: no two trials share a GPU
        setup.airflow("pools", "set", pool, str(slots), what)
    return setup


app = typer.Typer(help="Run servetune's DAGs with a real Airflow (metadata and warehouse in PostgreSQL).")


@app.command("env")
def env_cmd(state_dir: Path = typer.Option(REPO / ".servetune", help="Airflow home and results live here"),
            json_out: JsonFlag = False) -> None:
    """Print the environment (as shell exports, passwords redacted) the DAGs run with."""
    as_json = use_json(json_out)
    server_url, cluster = _localdb().resolve_server()
    try:
        setup = AirflowSetup(state_dir / "airflow", _make_url(server_url).set(database="servetune_airflow")
                             .render_as_string(hide_password=False),
                             _make_url(server_url).set(database="servetune").render_as_string(hide_password=False),
                             REPO / "plans" / "weekly", state_dir / "results")
        shown = {k: _localdb().redact(v) if "://" in v else v for k, v in sorted(setup.env().items())
                 if k.startswith(("AIRFLOW", "SERVETUNE"))}
        if as_json:  # the variables by name
            from servetune.logs import emit_json

            emit_json(shown)
        else:
            typer.echo("\n".join(f"export {k}={v}" for k, v in shown.items()))
    finally:
        if cluster:
            cluster.stop()


@app.command("standalone")
def standalone(state_dir: Path = typer.Option(REPO / ".servetune", help="Airflow home and results"),
               plans_dir: Path = typer.Option(REPO / "plans" / "weekly", envvar="SERVETUNE_PLANS_DIR",
                                              help="plans the weekly DAG runs"),
               unpause: bool = typer.Option(False, help="start the DAGs unpaused: the weekly schedule, the watcher"
                                                        " and its assets run at once (default: paused until you"
                                                        " unpause them in the UI)")) -> None:
    """`airflow standalone` bound to 127.0.0.1 with servetune's DAGs and no example DAGs (Ctrl-C stops)."""
    server_url, cluster = _localdb().resolve_server()
    try:
        with _airflow_errors():
            results = (state_dir / "results").resolve()
            setup = setup_for(state_dir.resolve(), server_url, plans_dir.resolve(), results)
            setup.paused = not unpause
            prepare(setup)
            if unpause:  # DAGs created earlier keep their state: unpause them too
                for dag_id in ("servetune_weekly", "servetune_on_change", "servetune_watch"):
                    setup.airflow("dags", "unpause", dag_id, check=False)
            console.print("[bold]airflow standalone[/] on http://127.0.0.1:8080 (credentials in "
                          f"{setup.home}/simple_auth_manager_passwords.json.generated); DAGs "
                          + ("unpaused" if unpause else "paused (unpause them in the UI, or --unpause)"))
            setup.airflow("standalone", check=False, quiet=False)
    finally:
        if cluster:
            cluster.stop()


@app.command("pools")
def pools_cmd(plans_dir: Path = typer.Option(REPO / "plans" / "weekly", envvar="SERVETUNE_PLANS_DIR",
                                             help="the plans whose GPU runners need a pool"),
              json_out: JsonFlag = False) -> None:
    """Create (or resize) the `servetune-<runner>` pools, one slot each, in the Airflow this environment points
    at (docker compose runs it in airflow-init): Airflow schedules no task of a pool that does not exist."""
    as_json = use_json(json_out)
    exe = shutil.which("airflow")
    if exe is None:
        raise typer.BadParameter("airflow is not installed in this environment (pip install 'servetune[airflow]')")
    made = []
    for pool, slots, what in runner_pools(plans_dir):
        subprocess.run([exe, "pools", "set", pool, str(slots), what], check=True, stdout=subprocess.DEVNULL)
        (_err if as_json else console).print(f"pool {pool}: {slots} slot ({what})")
        made.append({"pool": pool, "slots": slots, "description": what})
    if as_json:
        from servetune.logs import emit_json

        emit_json(made)


def demo(
    plans_dir: Path = typer.Option(REPO / "plans" / "weekly", help="plans folder the weekly DAG maps over"),
    state_dir: Path = typer.Option(REPO / ".servetune", help="Airflow home, results and reports"),
    load_mode: str = typer.Option("plan", help="the DAG's load_mode Param: plan | concurrency | rate (open-loop"
                                                " arrivals, the ramp's levels in req/s, a capacity at the SLA)"),
    clock: str = typer.Option("virtual", help="the DAG's clock Param: virtual (the simulator's virtual time, a"
                                              " couple of minutes) | live (the simulated server over HTTP in real"
                                              " time: as long as the GPU would take)"),
    json_out: JsonFlag = False,
) -> None:
    """The main job: run `servetune_weekly` through real Airflow against the simulated engine.

    The demo plan measures one server three ways: engineer A's protocol, engineer B's and the staged
    campaign; the report puts them side by side with the checklist's verdicts. Uses
    SERVETUNE_DATABASE_URL's server when set, else PostgreSQL on 127.0.0.1:5432, else a private
    cluster started (and stopped) here. Prints the comparison, the recommendation and the report path
    (--json: every experiment's outcome as one document; the tables on stderr).
    """
    as_json = use_json(json_out)
    out = _err if as_json else console
    if load_mode not in ("plan", "concurrency", "rate"):
        raise typer.BadParameter(f"must be plan, concurrency or rate, got {load_mode!r}", param_hint="--load-mode")
    if clock not in ("virtual", "live"):
        raise typer.BadParameter(f"must be virtual or live, got {clock!r}", param_hint="--clock")
    t_start = time.monotonic()
    server_url, cluster = _localdb().resolve_server()
    run_dir = (state_dir / "runs" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    try:
        with _airflow_errors():
            out.print(f"[bold]servetune demo[/]: PostgreSQL at {_localdb().redact(server_url)}"
                          + (" (private cluster, stopped at the end)" if cluster else ""))
            setup = prepare(setup_for(state_dir.resolve(), server_url, plans_dir.resolve(), run_dir / "results"))
            out.print("running DAG [bold]servetune_weekly[/] with `airflow dags test` ...")
            # `dags test` cannot take a person's answer (only an api-server can): `servetune accept` decides
            conf = ["--conf", orjson.dumps({"load_mode": load_mode, "clock": clock, "approval": "off"}).decode()]
            proc = setup.airflow("dags", "test", "servetune_weekly", *conf, check=False)
            (run_dir / "airflow-dags-test.log").write_text(proc.stdout or "")
            experiments = ResultFolder.under(run_dir / "results")
            if proc.returncode != 0 or not experiments:
                raise AirflowFailed(f"the DAG run failed (log: {run_dir / 'airflow-dags-test.log'})",
                                    (proc.stdout or "").splitlines()[-30:])
            for folder in experiments:
                print_outcome(out, folder, setup.warehouse_url)
            log = run_dir / "airflow-dags-test.log"
            out.print(f"done in {time.monotonic() - t_start:.0f} s; Airflow log: {log}")
            if as_json:
                from servetune.logs import emit_json

                emit_json({"experiments": [outcome_document(f, setup.warehouse_url) for f in experiments],
                           "airflow_log": str(log), "warehouse": _localdb().redact(setup.warehouse_url)})
            out.print("the warehouse, for `servetune history`, `servetune query` and SQL (password redacted):\n"
                      f"  export SERVETUNE_DATABASE_URL={_localdb().redact(setup.warehouse_url)}",
                      highlight=False, soft_wrap=True)
    finally:
        if cluster:
            cluster.stop()


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="airflow")
    root.command("demo")(demo)
