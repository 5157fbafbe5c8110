"""One convention for machine output in every command: ``--json``, before the command or after it.

With it a command prints one JSON document on stdout and nothing else there; progress and human
text stay on stderr. Without it, results go to stdout and progress to stderr all the same.
"""

from __future__ import annotations

from typing import Annotated

import typer

from servetune.logs import json_mode, set_json

JsonFlag = Annotated[bool, typer.Option(
    "--json", help="machine output: one JSON document on stdout (progress and human text on stderr);"
                   " the same as `servetune --json CMD`")]


def use_json(flag: bool) -> bool:
    """Turn JSON output on when the command's own ``--json`` was given; whether it is on, either way."""
    if flag:
        set_json()
    return json_mode()
