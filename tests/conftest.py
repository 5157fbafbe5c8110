"""Shared fixtures: a real PostgreSQL for the session (never a mock)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from sqlalchemy.engine import make_url

from servetune import localdb

pytest_plugins = ["tokenizer_fixtures", "vllm_cpu", "airflow_fixtures", "warehouse_fixtures"]


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


def _module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)  # noqa: SLF001 - pytest keeps a test's fixture definitions here
    defs = info.name2fixturedefs.values() if info is not None else []
    return any(d.scope in ("module", "class", "package") for chain in defs for d in chain)
