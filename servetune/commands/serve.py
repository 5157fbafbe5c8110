"""``servetune serve``: start one engine configuration and keep it up until Ctrl-C (or print what it would run).

``--dry-run`` validates the flags against the engine's catalogue and prints the exact command
(for ``--runner kubernetes``, the manifests); nothing on the runner is touched, so model paths
there are not checked.
"""

from __future__ import annotations

import shlex
import signal
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from servetune.commands.jsonout import JsonFlag, use_json

console = Console(stderr=True, soft_wrap=True)
RUNNERS = ("local", "ssh", "kubernetes")
#: an engine or runner field -> the option that sets it, so an error names what the user typed
_OPTION_OF = {"url": "--url", "model": "--model", "model_profile": "--model", "python": "--python",
              "version": "--sglang-version", "gpu_profile": "--gpu-profile", "ready_timeout_s": "--ready-timeout",
              "user": "--ssh-user", "ssh_port": "--ssh-port", "identity_file": "--identity-file",
              "known_hosts_file": "--known-hosts", "image": "--image", "namespace": "--namespace", "gpus": "--gpus"}


def _gpus(text: str | None) -> list[int] | None:
    from servetune.engines import FlagError

    if not text:
        return None
    try:
        gpus = [int(g) for g in text.split(",") if g.strip()]
    except ValueError:
        raise FlagError(f"--gpus: expected GPU indices like 0,1, got {text!r}") from None
    if any(g < 0 for g in gpus):
        raise FlagError(f"--gpus: GPU indices are >= 0, got {text!r}")
    return gpus


def _check_version(engine: str, version: str | None) -> None:
    """An explicit ``--sglang-version`` must name a catalogue (shipped, or cached from a runner of that
    version), as the sim's ``engine.version`` must: a typo or a future version used to fall back in silence."""
    from servetune.engines import FlagError
    from servetune.engines.catalog import available_versions, catalog_file, runner_catalog_dir

    known = available_versions(engine)
    if version is None or version in known or catalog_file(runner_catalog_dir(), engine, version).is_file():
        return
    raise FlagError(f"--sglang-version: no flag catalogue for {engine} {version!r} (catalogued: {', '.join(known)});"
                    f" generate one with `python -m servetune.engines.catalog --python PY_WITH_{engine.upper()}`")


def _option_names(message: str) -> str:
    """``url: Field required`` -> ``--url: Field required``: name the option, not the config field."""
    parts = []
    for part in message.split("; "):
        field, sep, rest = part.partition(": ")
        parts.append(f"{_OPTION_OF[field]}: {rest}" if sep and field in _OPTION_OF else part)
    return "; ".join(parts)


def _pydantic_line(exc) -> str:  # noqa: ANN001 - pydantic is imported lazily
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors())


def serve(
    engine: str = typer.Option(..., "--engine", help="sglang | vllm | sim | transformers | external"),
    model: str = typer.Option(None, "--model", help="model path (sglang, vllm, transformers) or model profile (sim)"),
    sets: list[str] = typer.Option([], "--set", help="engine flag as key=value (repeatable), typed per version"),
    runner: str = typer.Option("local", "--runner", help="local | ssh | kubernetes"),
    dry_run: bool = typer.Option(False, "--dry-run", help="validate and print the exact command; start nothing"),
    port: int = typer.Option(None, "--port", min=1, max=65535, help="port to serve on (default: a free one)"),
    host: str = typer.Option("127.0.0.1", "--host", help="address the engine binds (local runner)"),
    gpus: str = typer.Option(None, "--gpus", help="GPU indices, e.g. 0,1 (CUDA_VISIBLE_DEVICES)"),
    python: str = typer.Option(None, "--python", help="interpreter with the engine installed (on the runner)"),
    version: str = typer.Option(None, "--sglang-version", help="SGLang version the flags are written for (default:"
                                " the one --python imports on the local runner, else the newest catalogued)"),
    gpu_profile: str = typer.Option(None, "--gpu-profile", help="sim: GPU profile"),
    url: str = typer.Option(None, "--url", help="external: the endpoint's base URL"),
    ssh_host: str = typer.Option(None, "--ssh-host", help="ssh: the GPU host to start the engine on"),
    ssh_user: str = typer.Option(None, "--ssh-user", help="ssh: the login user (default: ssh's own)"),
    ssh_port: int = typer.Option(22, "--ssh-port", min=1, max=65535, help="ssh: the host's SSH port"),
    identity_file: Path = typer.Option(None, "--identity-file", help="ssh: the private key to log in with"),
    known_hosts: Path = typer.Option(None, "--known-hosts",
                                     help="ssh: the known_hosts file the host's key is checked against"),
    image: str = typer.Option(None, "--image", help="kubernetes: engine image"),
    namespace: str = typer.Option("default", "--namespace", help="kubernetes: the namespace of the engine's pod"),
    log_dir: Path = typer.Option(None, "--log-dir", help="engine logs (default ~/.cache/servetune/logs)"),
    ready_timeout: float = typer.Option(None, "--ready-timeout", help="seconds to wait for readiness"),
    no_preflight: bool = typer.Option(False, "--no-preflight", help="skip the clean-environment check"),
    json_out: JsonFlag = False,
) -> None:
    """Start an engine with a configuration and serve until Ctrl-C; --dry-run prints the exact command.

    With --json: the command (--dry-run), or once the engine serves its URL, pid, log and command, as one
    JSON document on stdout."""
    as_json = use_json(json_out)
    from pydantic import ValidationError

    from servetune.engines import ENGINE_KINDS, ENGINES, EngineFailure, FlagError, engine_from_cli
    from servetune.logs import emit_json
    from servetune.redact import redact_text
    from servetune.runners import KubernetesRunnerConfig, LocalRunnerConfig, Server, SSHRunnerConfig
    from servetune.runners.kubernetes import build_manifests, manifests_yaml

    fields = {"python": python, "version": version, "gpu_profile": gpu_profile, "url": url,
              "ready_timeout_s": ready_timeout}
    try:
        if engine not in ENGINE_KINDS:
            raise FlagError(f"--engine: unknown engine {engine!r} (one of {', '.join(ENGINE_KINDS)})")
        if runner not in RUNNERS:
            raise FlagError(f"--runner: unknown runner {runner!r} (one of {', '.join(RUNNERS)})")
        spec = ENGINES[engine]
        stray = [k for k, v in fields.items() if v is not None and k not in spec.cli_options]
        if stray:
            option = _OPTION_OF.get(stray[0], "--" + stray[0].replace("_", "-"))
            raise FlagError(f"{option} does not apply to --engine {engine}")
        _check_version(engine, version if "version" in spec.cli_options and engine == "sglang" else None)
        if spec.cli_needs_model and not model:
            raise FlagError(f"--engine {engine} needs --model PATH")
        fields = spec.cli_resolve({k: v for k, v in fields.items() if k in spec.cli_options}, runner=runner)
        cfg = engine_from_cli(engine, model=model, sets=sets, **fields)
        common = {"check_clean": not no_preflight}
        if runner == "local":
            run_cfg = LocalRunnerConfig(host=host, gpus=_gpus(gpus), **common)
        elif runner == "ssh":
            if not ssh_host:
                raise FlagError("--runner ssh needs --ssh-host")
            run_cfg = SSHRunnerConfig(host=ssh_host, user=ssh_user, ssh_port=ssh_port, identity_file=identity_file,
                                      known_hosts_file=known_hosts, gpus=_gpus(gpus), **common)
        elif runner == "kubernetes":
            run_cfg = KubernetesRunnerConfig(**({"image": image} if image else {}), namespace=namespace,
                                             gpus=len(_gpus(gpus) or [0]), **common)
    except (FlagError, ValidationError) as exc:
        text = _pydantic_line(exc) if isinstance(exc, ValidationError) else str(exc)
        console.print(f"[red]error:[/red] {escape(redact_text(_option_names(text)))}", highlight=False)
        raise typer.Exit(2) from None

    if isinstance(run_cfg, KubernetesRunnerConfig):
        if not dry_run:
            console.print("[red]error:[/red] --runner kubernetes prints manifests only: add --dry-run and "
                          "kubectl apply -f them (docs/engines.md)", highlight=False)
            raise typer.Exit(2)
        manifests = build_manifests(cfg, run_cfg)
        if as_json:
            emit_json({"engine": cfg.kind, "manifests": manifests})
        else:
            typer.echo(manifests_yaml(manifests), nl=False)
        return

    server = Server(cfg, run_cfg, port=port, log_dir=log_dir)
    if dry_run:
        argv = server.plan(dry_run=True) if cfg.launches else None
        if as_json:
            emit_json({"engine": cfg.kind, "launches": cfg.launches, "url": None if argv else cfg.endpoint_url,
                       "command": argv})
        elif argv is None:
            typer.echo(f"# {cfg.kind} endpoint {cfg.endpoint_url}: measured, not launched")
        else:
            typer.echo(shlex.join(argv))
        return

    def _terminate(signum, frame):  # a SIGTERM (Airflow, systemd) tears down like Ctrl-C
        raise KeyboardInterrupt

    # SIGINT too, explicitly: a process started in the background by a non-interactive shell inherits SIGINT
    # ignored, and Python then installs no Ctrl-C handler, so `kill -INT` would leave the engine serving
    previous = signal.signal(signal.SIGTERM, _terminate)
    previous_int = signal.signal(signal.SIGINT, _terminate)
    try:
        running = server.wait_ready()
        if as_json:  # the one document, as soon as the engine serves; the teardown's line goes to stderr
            emit_json({"engine": cfg.kind, "url": running.url, "pid": running.pid, "log": running.log_path,
                       "command": running.argv})
        else:
            typer.echo(f"ready: {running.url}  (engine {cfg.describe()}, pid {running.pid}, log {running.log_path})")
            typer.echo(f"command: {shlex.join(running.argv)}")
        sys.stdout.flush()
        while True:
            running.check_alive()
            time.sleep(1.0)
    except KeyboardInterrupt:
        console.print("stopping...")
    except EngineFailure as exc:
        console.print(f"[red]{exc.details()}[/red]")
        raise typer.Exit(1) from None
    finally:
        report = server.stop()
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
        if server._started and cfg.launches:
            console.print(f"teardown: {'clean' if report.clean else 'NOT clean: ' + '; '.join(report.problems)} "
                          f"(signals {', '.join(report.signals) or 'none'}, GPU {report.gpu})")


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
