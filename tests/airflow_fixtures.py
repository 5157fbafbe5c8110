"""A real Airflow for the tests: metadata and warehouse in the session's PostgreSQL, DAGs run as
subprocesses (`airflow dags test`), exactly as the main job runs them."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy.engine import make_url

from servetune import localdb
from servetune.commands.airflow import AirflowSetup, prepare_databases, register_dags

REPO = Path(__file__).resolve().parents[1]

TINY_PLAN = {
    "name": "tiny-sim",
    "model": "llama-3.1-8b",
    "engine": {"kind": "sim", "model_profile": "llama-3.1-8b", "gpu_profile": "A100-80G", "load_seconds": 0.2},
    "runner": {"kind": "local"},
    "endpoint": "chat",
    "workload": {"name": "tiny", "seed": 1, "input": {"kind": "uniform", "min": 64, "max": 256},
                 "output": {"kind": "fixed", "value": 8},
                 "shared_prefix": {"tokens": 32, "share_ratio": 0.8, "num_prefixes": 1}},
    "sla": {"p99_ttft_ms": 2000, "p99_tpot_ms": 200},
    "stages": {"correctness": {"requests": 1},
               "baseline": {"concurrency": 2, "requests": 12, "warmup": 2},
               "ramp": {"levels": [4, 8], "requests": 16, "warmup": 2, "bisect": False},
               "refine": {"grid": {"chunked-prefill-size": [2048, 8192]}, "set_max_running": False,
                          "extend_levels": 0}},
    # tiny trials: a 1 s steady window and 12 completions are enough to call them VALID here
    "validation": {"min_measured": 10, "min_window_s": 1.0, "min_completions": 12, "completions_per_stream": 2},
    # a 1 s window on a 2-core box shared with Airflow can miss once more than a GPU trial would
    "repeats": {"count": 1, "invalid_retries": 2},
    "budget": {"max_gpu_minutes": 10, "restart_cost_s": 1},
}


def write_plan(folder: Path, file: str = "tiny", **changes) -> Path:
    """``folder/<file>.yaml``: the tiny plan with ``changes`` (``name=`` renames the plan itself)."""
    plan = {**TINY_PLAN, **changes}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{file}.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    return path


@pytest.fixture(scope="session")
def airflow_templates(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(metadata, warehouse) template databases, migrated once a session (Airflow's migration is ~15 s of
    CLI work); each test copies them (``CREATE DATABASE ... TEMPLATE``) and registers its own DAGs and pools."""
    meta = localdb.create_database(pg_server_url)
    wh = localdb.create_database(pg_server_url)
    root = tmp_path_factory.mktemp("airflow-template")
    try:
        prepare_databases(AirflowSetup(home=root / "airflow", metadata_url=meta, warehouse_url=wh,
                                       plans_dir=root / "plans", results_dir=root / "results"))
        yield make_url(meta).database, make_url(wh).database
    finally:
        for url in (meta, wh):
            localdb.drop_database(pg_server_url, make_url(url).database)


@pytest.fixture
def airflow_setup(pg_server_url: str, airflow_templates: tuple[str, str], tmp_path: Path) -> Iterator[AirflowSetup]:
    """Fresh metadata and warehouse databases, migrated (copies of the session's templates); the DAGs
    registered with plans and results under tmp_path."""
    meta_tpl, wh_tpl = airflow_templates
    meta = localdb.create_database(pg_server_url, template=meta_tpl)
    wh = localdb.create_database(pg_server_url, template=wh_tpl)
    plans = tmp_path / "plans"
    write_plan(plans)
    setup = AirflowSetup(home=tmp_path / "airflow", metadata_url=meta, warehouse_url=wh, plans_dir=plans,
                         results_dir=tmp_path / "results")
    try:
        yield register_dags(setup)
    finally:
        for url in (meta, wh):
            localdb.drop_database(pg_server_url, make_url(url).database)


def template_file(folder: Path, text: str = "{{ system }}\n{{ user }}\n") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "chat_template.jinja"
    path.write_text(textwrap.dedent(text))
    return path


def copy_demo_plan(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(REPO / "plans" / "demo.yaml", dest / "demo.yaml"))
