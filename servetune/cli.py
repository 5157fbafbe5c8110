"""The ``servetune`` command. Each command group lives in its own module; this file only wires them.

It also owns the error policy of every command (issue 14): one line per error on stderr, naming the
flag, field or path and what is wrong; a usage error exits 2, an unexpected exception 1; the
traceback only under ``-v``. Rich never hard-wraps those lines at 80 columns (a pipe, a CI or an
Airflow log), so one line stays one line.
"""

from __future__ import annotations

import errno
import inspect
import sys
import traceback
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from servetune.commands.jsonout import JsonFlag, use_json
from servetune.oserrors import os_error_text

# Typer vendors click (>= 0.26) and exports only some of its exceptions: the base classes come from
# the MRO of the public ``typer.BadParameter`` rather than from a private module.
_MRO = {c.__name__: c for c in typer.BadParameter.__mro__}
ClickException: type[Exception] = _MRO["ClickException"]
UsageError: type[Exception] = _MRO["UsageError"]


class _Run:
    verbose = False  # set by the root callback (``-v``) before any command runs


def error_line(message: str) -> None:
    """Print ``error: MESSAGE`` as one unwrapped line on stderr (markup escaped, secrets masked)."""
    from servetune.redact import redact_text

    text = " ".join(redact_text(message).split())
    Console(stderr=True, soft_wrap=True, highlight=False).print(f"[red]error:[/red] {escape(text)}")


def _usage_message(exc: Any, argv: list[str]) -> str:
    """Click's message, with the value the user gave (Typer's type errors leave it out) and where to look."""
    ctx, param, message = getattr(exc, "ctx", None), getattr(exc, "param", None), exc.format_message()
    for i, arg in enumerate(argv):
        for opt in getattr(param, "opts", ()) if getattr(param, "param_type_name", "") == "option" else ():
            value = argv[i + 1] if arg == opt and i + 1 < len(argv) else arg.partition("=")[2]
            if (arg == opt or arg.startswith(f"{opt}=")) and value and repr(value) not in message:
                message = message.replace("Invalid value for ", f"Invalid value {value!r} for ", 1)
    hint = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
    return f"{message}{hint}"


def unexpected_message(exc: BaseException) -> str:
    """One line for an exception no command expected: the file an OSError names, every pydantic field."""
    from pydantic import ValidationError

    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg'].removeprefix('Value error, ')}"
                         for e in exc.errors())
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _paragraphs(text: str) -> str:
    """A docstring as ``--help`` shows it: each paragraph one line for Rich to wrap at the terminal's width.

    Typer's rich mode keeps a docstring's single line breaks after the first paragraph, cutting sentences
    at the source's 120 columns; a paragraph marked ``\\b`` (click's "keep as is") or a list keeps them.
    """
    body, cut, rest = inspect.cleandoc(text).partition("\f")
    kept = [p if p.startswith("\b") or p.lstrip().startswith(("- ", "* ")) else " ".join(p.split())
            for p in body.split("\n\n")]
    return "\n\n".join(kept) + cut + rest


def _readable_help(cmd: Any) -> None:
    """Every command under ``cmd``, once: paragraphs rewrapped, and a switch (``--dry-run``, ``--help``)
    shown bare: Typer 0.29 prints a flag's type, ``<bool>``, as if it took a value."""
    if cmd.help:
        cmd.help = _paragraphs(cmd.help)
    own_params = cmd.get_params

    def get_params(ctx: Any) -> Any:  # --help and the completion switches are added late: all of them here
        params = own_params(ctx)
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""  # the rich help prints a set metavar instead of the type
        return params

    cmd.get_params = get_params
    for sub in (getattr(cmd, "commands", None) or {}).values():
        _readable_help(sub)


class OneLineErrors(TyperGroup):
    """The root group: runs the command with Typer's handling off and reports every failure as one line.

    Built once per invocation, after every command under it: it makes their help readable then."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _readable_help(self)

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        _Run.verbose = False
        argv = list(sys.argv[1:] if args is None else args)
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False,
                              **extra)
            code = rv if isinstance(rv, int) else 0  # Typer returns typer.Exit's code in this mode
        except ClickException as exc:
            code = exc.exit_code  # type: ignore[attr-defined]
            if type(exc).__name__ == "NoArgsIsHelpError":  # no arguments: the help, which Typer printed
                if self.rich_markup_mode is None:
                    exc.show()  # type: ignore[attr-defined]
            else:
                error_line(_usage_message(exc, argv))
        except typer.Abort:
            error_line("aborted")
            code = 1
        except OSError as exc:  # at the boundary: the path and the cause; a full disk is not the input's fault
            if _Run.verbose:
                traceback.print_exception(exc, file=sys.stderr)
            error_line(os_error_text(exc))
            code = 1 if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS) else 2
        except Exception as exc:  # noqa: BLE001 - the one place an unexpected error becomes one line
            if _Run.verbose:
                traceback.print_exception(exc, file=sys.stderr)
            error_line(f"{unexpected_message(exc)} (unexpected: run with -v for the traceback)")
            code = 1
        if not standalone_mode:
            return code
        sys.exit(code)


app = typer.Typer(
    name="servetune",
    help="Controlled, complete and comparable benchmarks and tuning for LLM serving engines.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    cls=OneLineErrors,
)


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="debug logging, libraries' too; tracebacks"),
          json: bool = typer.Option(False, "--json", help="machine output of any command that gives a result:"
                                    " one JSON document on stdout, human text on stderr (the same as"
                                    " `servetune CMD --json`)")) -> None:
    _Run.verbose = verbose
    from servetune.logs import setup
    from servetune.redact import install_log_redaction

    setup(verbose=verbose, json=json)  # libraries quiet below WARNING unless -v (servetune/logs.py)

    install_log_redaction()  # every log line of every module, whatever it formats


@app.command()
def version(json_out: JsonFlag = False) -> None:
    """Print servetune's version."""
    from servetune import __version__
    from servetune.logs import emit_json

    if use_json(json_out):
        emit_json({"version": __version__})
        return
    typer.echo(__version__)


def _no_hard_wrap() -> None:
    """Commands' stderr consoles print long lines whole (soft wrap): an error is never cut into two lines."""
    for name, module in list(sys.modules.items()):
        console = getattr(module, "console", None) if name.startswith("servetune.commands.") else None
        if isinstance(console, Console) and console.stderr:
            console.soft_wrap = True


def _register() -> None:
    from importlib import import_module

    for name in (
        # --- command modules: one line each ---
        "bench",
        "report",
        "history",
        "tune",
        "db",
        "load",
        "validate",
        "query",
        "sim",
        "serve",
        "airflow",
        "trace",
        "diagnose",
        # --- end command modules ---
    ):
        import_module(f"servetune.commands.{name}").register(app)
    _no_hard_wrap()


_register()

if __name__ == "__main__":
    app()
