"""The Postgres harness itself: the private-cluster path must work when nothing is configured."""

import psycopg
import pytest

from servetune import localdb


def test_session_database_is_real(database_url):
    with psycopg.connect(localdb.libpq_dsn(database_url)) as conn:
        assert conn.execute("select 1 + 1").fetchone()[0] == 2


def test_private_cluster_starts_and_stops():
    if localdb._pg_bindir() is None:
        pytest.importorskip("pgserver")
    cluster = localdb.start_private_cluster()
    try:
        url = localdb.create_database(cluster.url, "probe")
        with psycopg.connect(localdb.libpq_dsn(url)) as conn:
            assert conn.execute("select current_database()").fetchone()[0] == "probe"
    finally:
        cluster.stop()
    assert not localdb.answers(cluster.url, timeout=1)


def test_redact_hides_password():
    red = localdb.redact("postgresql+psycopg://u:s3cret@h:5432/db")
    assert "s3cret" not in red and "u:" in red
