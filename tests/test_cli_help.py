"""Every subcommand's help as a new user reads it: each option and argument says what it is for, and
``--help`` answers for every command (issue 33)."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from servetune.cli import app


def commands() -> list[tuple[list[str], object]]:
    """(path, command) for the root, every group and every command under it."""
    out: list[tuple[list[str], object]] = []

    def walk(cmd: object, path: list[str]) -> None:
        out.append((path, cmd))
        for name, sub in sorted((getattr(cmd, "commands", None) or {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return out


def test_every_option_and_argument_has_a_description() -> None:
    found = commands()
    assert len(found) > 20  # the walk reached the subcommands
    bare = [f"servetune {' '.join(path)} {'/'.join(p.opts)}" for path, cmd in found for p in cmd.params
            if p.name != "help" and not (getattr(p, "help", None) or "").strip()]
    assert bare == []


def test_the_simulated_servers_sglang_flags_say_what_they_do() -> None:
    """``sim serve`` parses SGLang's own flags (argparse, as SGLang does): each says what it models too."""
    from servetune.sim.args import build_parser

    actions = [a for a in build_parser()._actions if a.dest != "help"]
    assert len(actions) > 15
    assert [a.option_strings[0] for a in actions if not (a.help or "").strip()] == []


def test_every_command_answers_help() -> None:
    runner = CliRunner()
    for path, cmd in commands():
        res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "160"})
        assert res.exit_code == 0, (path, res.output)
        assert "usage:" in res.output.lower() and (not path or path[-1] in res.output)
        if getattr(cmd, "help", None) is not None:  # the command's own one-line purpose is shown
            assert cmd.help.strip().split()[0] in res.output, path
