"""Issue 44's boundary classes, part of bench/bad_inputs.py's catalogue: addresses that point at the wrong thing
(a port out of range, a DSN at a web server or a silent port), a warehouse whose schema is not this servetune's
(behind, ahead, foreign, never migrated), and OS errors at a path (a name too long, a symlink loop, a damaged
campaign state). Each is one line naming the option, the path or the way the schema is off; docs/reliability.md,
"Inputs from outside are bounded". The reads from an engine (an endless line, a body past its limit) are
bench/faults.py's ``endless_line`` and tests/test_limits.py: they need an engine that misbehaves on purpose.

Placeholders filled by the catalogue (``bad_inputs.places``): ``{db_ahead}``, ``{db_behind}``, ``{db_foreign}``,
``{db_empty}``, ``{db_other}`` (databases in that state), ``{http}`` (a loopback port that answers HTTP),
``{silent}`` (one that takes connections and never answers).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SECRET = "Sup3rS3cret-pw"  # the catalogue's planted secret (bench/bad_inputs.py): never to be printed
PORT = "port must be a number from 1 to 65535"
LONG, LOOP = "file names take at most 255", "symlink loop"
NOT_PG = "not as a PostgreSQL server"
BEHIND, AHEAD, FOREIGN = "behind this servetune's", "newer than this servetune's", "not a servetune warehouse"
NEVER = "never migrated"
DAMAGED = "is damaged"
NAME = "n" * 300
SIM = "name: bad\nmodel: m\nsla: {p99_ttft_ms: 500}\nengine: {kind: sim}\nstages: {refine: {enabled: false}}\n"
XID = "0123456789abcdef0123456789abcdef"
EXPERIMENT = f'{{"experiment_id": "{XID}"}}'  # a campaign folder's record, enough for --resume to open it


class Link(str):
    """A file the catalogue writes as a symlink to this target, not as a file with this text."""


#: (name, plan patch, words the message names): each runs ``servetune tune plan.yaml --dry-run``
PLAN: list[tuple[str, Any, tuple[str, ...]]] = [
    ("plan_external_url_port_99999", {"engine": {"kind": "external", "url": "http://127.0.0.1:99999"},
                                      "stages": {"refine": {"enabled": False}}}, ("engine.external.url", PORT)),
]

#: (name, bench options over the catalogue's defaults, words the message names, files)
BENCH: list[tuple[str, list[str], tuple[str, ...], dict[str, Any]]] = [
    # addresses: the variant the issue names, then ours
    ("bench_url_port_99999", ["--url", "http://127.0.0.1:99999"], ("--url", PORT, "99999"), {}),
    ("bench_url_port_0", ["--url", "http://127.0.0.1:0"], ("--url", PORT), {}),
    ("bench_url_port_not_a_number", ["--url", "http://127.0.0.1:http"], ("--url", PORT), {}),
    ("bench_url_port_70000_with_password", ["--url", f"http://u:{SECRET}@127.0.0.1:70000"], ("--url", PORT, "u:***@"),
     {}),
    ("bench_url_port_negative", ["--url", "http://127.0.0.1:-1"], ("--url", PORT), {}),
    # OS errors at a path: the variant the issue names, then ours
    ("bench_out_name_300", ["--out", f"{NAME}.json"], ("--out", LONG, "305 bytes"), {}),
    ("bench_out_folder_name_300", ["--out", f"{NAME}/r.json"], ("--out", LONG), {}),
    ("bench_out_symlink_loop", ["--out", "loop.json"], ("--out", LOOP), {"loop.json": Link("loop.json")}),
    ("bench_out_link_to_dev_full", ["--out", "full.json"], ("--out", "/dev/full", "not a regular file"),
     {"full.json": Link("/dev/full")}),
    ("bench_workload_symlink_loop", ["--workload", "w.yaml"], ("w.yaml",), {"w.yaml": Link("w.yaml")}),
]

WAREHOUSE = ["--database-url"]

#: (name, argv after ``servetune``, words the message names, files): warehouses, campaign folders, paths
OTHER: list[tuple[str, list[str], tuple[str, ...], dict[str, Any]]] = [
    # addresses: a DSN at the wrong service (the variant the issue names, then ours)
    ("db_url_http_port", ["db", "current", *WAREHOUSE, f"postgresql://u:{SECRET}@127.0.0.1:{{http}}/w"],
     ("warehouse", NOT_PG, "database's port"), {}),
    ("db_url_silent_port", ["db", "current", *WAREHOUSE,
                            f"postgresql://u:{SECRET}@127.0.0.1:{{silent}}/w?connect_timeout=2"],
     ("warehouse", "gave no PostgreSQL answer", "connect_timeout=2"), {}),
    ("db_url_port_99999", ["db", "current", *WAREHOUSE, f"postgresql://u:{SECRET}@127.0.0.1:99999/w"],
     ("warehouse", "99999"), {}),
    ("serve_external_url_port_99999", ["serve", "--engine", "external", "--url", "http://127.0.0.1:99999",
                                       "--dry-run"], ("--url", PORT), {}),
    ("load_http_port_warehouse", ["load", "r.json", *WAREHOUSE, "postgresql://u@127.0.0.1:{http}/w"],
     ("warehouse", NOT_PG), {"r.json": "{}"}),
    # the warehouse's schema: the variant the issue names, then ours
    ("load_warehouse_ahead", ["load", "runs", *WAREHOUSE, "{db_ahead}"], ("load", AHEAD, "upgrade servetune"), {}),
    ("load_warehouse_behind", ["load", "runs", *WAREHOUSE, "{db_behind}"], ("load", BEHIND, "db upgrade"), {}),
    ("load_warehouse_foreign", ["load", "runs", *WAREHOUSE, "{db_foreign}"], ("load", FOREIGN, "customers"), {}),
    ("load_warehouse_never_migrated", ["load", "runs", *WAREHOUSE, "{db_empty}"], ("load", NEVER, "db upgrade"), {}),
    ("load_warehouse_other_revision", ["load", "runs", *WAREHOUSE, "{db_other}"], ("load", "a1b2c3d4e5f6", AHEAD), {}),
    ("accept_warehouse_ahead", ["accept", XID, "--why", "ok", *WAREHOUSE, "{db_ahead}"], ("accept", AHEAD), {}),
    ("accept_warehouse_foreign", ["accept", XID, "--why", "ok", *WAREHOUSE, "{db_foreign}"], ("accept", FOREIGN), {}),
    ("history_warehouse_behind", ["history", "--model", "m", *WAREHOUSE, "{db_behind}"], ("history", BEHIND), {}),
    ("history_warehouse_never_migrated", ["history", "--model", "m", *WAREHOUSE, "{db_empty}"], ("history", NEVER),
     {}),
    ("db_upgrade_foreign_database", ["db", "upgrade", *WAREHOUSE, "{db_foreign}"], ("db upgrade", FOREIGN), {}),
    # OS errors and damaged files: the variants the issue names, then ours
    ("tune_resume_state_truncated", ["tune", "plan.yaml", "--virtual", "--out", "runs", "--resume"],
     ("runs/state.json", DAMAGED, "EOF", "new folder"),
     {"plan.yaml": SIM, "runs/experiment.json": EXPERIMENT, "runs/state.json": '{"outcomes": [{"stage": "ba'}),
    ("tune_resume_state_not_a_state", ["tune", "plan.yaml", "--virtual", "--out", "runs", "--resume"],
     ("runs/state.json", DAMAGED, "outcomes.0"),
     {"plan.yaml": SIM, "runs/experiment.json": EXPERIMENT, "runs/state.json": '{"outcomes": [{"x": 1}]}'}),
    ("tune_resume_experiment_truncated", ["tune", "plan.yaml", "--virtual", "--out", "runs", "--resume"],
     ("runs/experiment.json", DAMAGED), {"plan.yaml": SIM, "runs/experiment.json": EXPERIMENT[:20]}),
    ("tune_resume_not_a_campaign", ["tune", "plan.yaml", "--virtual", "--out", "runs", "--resume"],
     ("runs/experiment.json", "campaign folder"), {"plan.yaml": SIM, "runs/notes.txt": "x"}),
    ("load_symlink_loop", ["load", "loop", *WAREHOUSE, "{db}"], ("loop", "symbolic links"), {"loop": Link("loop")}),
    ("validate_symlink_loop", ["validate", "loop.json"], ("loop.json", "symbolic links"),
     {"loop.json": Link("loop.json")}),
    ("validate_name_300", ["validate", f"{NAME}.json"], ("File name too long", "ENAMETOOLONG"), {}),
    ("report_out_name_300", ["report", "runs", "--out", NAME], ("--out", LONG), {"runs/notes.txt": "x"}),
    ("report_symlink_loop", ["report", "loop.json"], ("loop.json", "symbolic links"), {"loop.json": Link("loop.json")}),
    ("tune_out_name_300", ["tune", "plan.yaml", "--virtual", "--out", NAME], ("--out", LONG),
     {"plan.yaml": SIM}),
    ("tune_plan_symlink_loop", ["tune", "plan.yaml", "--dry-run"], ("plan.yaml", "symbolic links"),
     {"plan.yaml": Link("plan.yaml")}),
]

STATES = ("db_ahead", "db_behind", "db_foreign", "db_empty", "db_other")


def _make_state(url: str, state: str) -> None:
    """Put a fresh database in ``state``: a revision from the future or from another project, one behind,
    someone else's tables, or nothing at all."""
    from sqlalchemy import text

    from servetune.warehouse import db, migrate

    if state in ("db_ahead", "db_behind", "db_other"):
        migrate.upgrade(url, "0014" if state == "db_behind" else "head")
    sql = {"db_ahead": "update alembic_version set version_num = '0099_from_the_future'",
           "db_other": "update alembic_version set version_num = 'a1b2c3d4e5f6'",
           "db_foreign": "create table customers (id int primary key, name text)"}.get(state)
    if sql:
        eng = db.engine(url)
        try:
            with eng.begin() as conn:
                conn.execute(text(sql))
        finally:
            eng.dispose()


def _answer_http(sock: Any) -> None:
    """Answer every connection as a web server answers bytes it cannot parse (a DSN pointed at it)."""
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        with conn:
            try:
                conn.recv(1024)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            except OSError:
                pass


@contextmanager
def places(server_url: str, db_url: str | None = None) -> Iterator[dict[str, str]]:
    """Every placeholder the cases name: ``db`` (given, migrated), the databases in ``STATES`` (made on the
    Postgres at ``server_url``, dropped at the end), ``http`` and ``silent`` loopback ports."""
    import socket
    import threading

    from sqlalchemy.engine import make_url

    from servetune import localdb

    made: list[str] = []
    web, quiet = socket.socket(), socket.socket()
    try:
        out = {"db": db_url or "{db}"}
        for state in STATES:
            url = localdb.create_database(server_url)
            made.append(url)
            _make_state(url, state)
            out[state] = url
        for sock in (web, quiet):
            sock.bind(("127.0.0.1", 0))
            sock.listen(16)  # the kernel completes the handshake; ``quiet`` never accepts, so it never answers
        threading.Thread(target=_answer_http, args=(web,), daemon=True).start()
        out["http"], out["silent"] = str(web.getsockname()[1]), str(quiet.getsockname()[1])
        yield out
    finally:
        web.close()
        quiet.close()
        for url in made:
            localdb.drop_database(server_url, make_url(url).database)


@contextmanager
def warehouse() -> Iterator[dict[str, str]]:
    """The cases' places: a fresh database on the local Postgres (or a private cluster), migrated, and the
    boundary cases' databases and ports (bad_inputs_boundary.places); dropped at the end."""
    from sqlalchemy.engine import make_url

    from servetune import localdb
    from servetune.warehouse import migrate

    server, cluster = localdb.resolve_server("SERVETUNE_TEST_DATABASE_URL")
    url = localdb.create_database(server)
    try:
        migrate.upgrade(url)
        with places(server, url) as filled:
            yield filled
    finally:
        localdb.drop_database(server, make_url(url).database)
        if cluster is not None:
            cluster.stop()


def needs(argv: list[str]) -> set[str]:
    """The places (``db``, ``db_ahead``, ``http``, ...) an argv names."""
    return set(re.findall(r"\{([a-z_]+)\}", " ".join(argv)))
