"""The CLI's output policy (issue 20): what reaches the terminal at default verbosity, and ``--json``.

Default: servetune's own log lines from INFO, every library's (Great Expectations, Alembic, httpx,
urllib3, asyncio, ...) only from WARNING, library ``warnings`` not at all; ``-v`` shows everything
from DEBUG. A filter on the one handler the CLI installs, not levels set on library loggers, so
nothing global changes for an embedding caller (Airflow, pytest) and a library's new logger is
covered without being named. ``--json``: one JSON document on stdout; human text goes to stderr.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _State:
    verbose = False
    json = False
    quiet: set[str] = set()  # servetune loggers a command reports itself (their INFO lines are redundant)


def _own(name: str) -> bool:
    return name == "servetune" or name.startswith("servetune.") or name == "__main__"


class Policy(logging.Filter):
    """Servetune's INFO and up, other loggers' WARNING and up; everything under ``-v``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _State.verbose:
            return True
        if record.name == "py.warnings":  # a library's DeprecationWarning etc.: -v only
            return False
        if _own(record.name):
            quiet = any(record.name == q or record.name.startswith(q + ".") for q in _State.quiet)
            return record.levelno >= (logging.WARNING if quiet else logging.INFO)
        return record.levelno >= logging.WARNING


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to the current ``sys.stderr`` (a test runner swaps it between invocations)."""

    def __init__(self) -> None:
        super().__init__()
        self.addFilter(Policy())
        self.setFormatter(logging.Formatter(FORMAT))

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler.__init__ sets it; the property wins
        pass


def setup(verbose: bool = False, json: bool = False) -> None:
    """Called once per command: the level, the policy and the ``--json`` switch for this invocation."""
    _State.verbose, _State.json, _State.quiet = verbose, json, set()
    root = logging.getLogger()
    if not root.handlers:  # like basicConfig: a caller that configured logging keeps its handlers (and warnings)
        root.addHandler(_StderrHandler())
        logging.captureWarnings(True)  # a library's warnings become py.warnings records: shown under -v only
    root.setLevel(logging.DEBUG if verbose else logging.INFO)


def quiet_info(logger: str) -> None:
    """A command that prints the same thing itself: that logger's INFO lines only under ``-v``."""
    _State.quiet.add(logger)


def console(stderr: bool = False) -> Any:
    """A Rich console for tables: a pipe or a log file gets 120 columns, not Rich's 80 (no names cut to '…')."""
    import os

    from rich.console import Console

    c = Console(stderr=stderr)
    return c if c.is_terminal or os.environ.get("COLUMNS") else Console(stderr=stderr, width=120)


def verbose() -> bool:
    return _State.verbose


def set_json() -> None:
    """A command's own ``--json`` (``servetune CMD --json``): the same switch as ``servetune --json CMD``."""
    _State.json = True


def json_mode() -> bool:
    """``servetune --json CMD``: CMD prints one JSON document on stdout and nothing else there."""
    return _State.json


def emit_json(document: Any) -> None:
    """The one JSON document of a ``--json`` command, on stdout (pydantic models and paths included)."""
    def default(value: Any) -> Any:
        if hasattr(value, "model_dump"):
            return value.model_dump(mode="json")
        return str(value)

    sys.stdout.write(orjson.dumps(document, default=default, option=orjson.OPT_INDENT_2).decode() + "\n")
    sys.stdout.flush()
