"""``servetune sim``: the simulated SGLang server (a model of SGLang, never a measurement).

``serve`` hands its raw argv to the SGLang-compatible argparse parser (servetune.sim.args), so
flags, defaults and the rejection of unknown flags (exit code 2, "unrecognized arguments") are
exactly SGLang's ``launch_server`` behaviour.
"""

from __future__ import annotations

import errno
import logging
import sys
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from servetune.commands.jsonout import JsonFlag, use_json

sim_app = typer.Typer(
    name="sim",
    help="Simulated SGLang server: same flags, endpoints and /metrics, modelled timings (docs/sim.md).",
    no_args_is_help=True,
)
console = Console(stderr=True)


@sim_app.command(
    "serve",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def serve(ctx: typer.Context) -> None:
    """Start the simulated server: SGLang's flags plus --model-profile/--gpu-profile (try --help)."""
    from servetune.sim.args import SimArgsError, build_parser, resolve
    from servetune.sim.profiles import ProfileError, load_gpu_profile, load_model_profile
    from servetune.sim.server import run

    parser = build_parser()
    parser.error = _refuse  # type: ignore[method-assign] # argparse's usage block -> one line, same words
    ns = parser.parse_args(list(ctx.args))  # bad flags exit 2 like SGLang
    try:
        for flag, load, name in (("--model-profile", load_model_profile, ns.model_profile),
                                 ("--gpu-profile", load_gpu_profile, ns.gpu_profile)):
            try:
                load(name)
            except ProfileError as exc:
                raise ProfileError(f"{flag}: {exc}") from None
        args = resolve(ns)
    except (SimArgsError, ProfileError) as exc:
        _refuse(str(exc), usage=False)
    level = getattr(logging, args.log_level.upper(), logging.INFO)
    logging.basicConfig(level=level, format="[%(asctime)s] %(message)s", stream=sys.stderr, force=True)
    try:
        run(args)
    except OSError as exc:  # binding: SGLang's words (servetune.engines.failures reads "address already in use")
        why = "address already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        _refuse(f"--port {args.port}: cannot listen on {args.host}:{args.port}: {why}", usage=False)


@sim_app.command("profiles")
def profiles(json_out: JsonFlag = False) -> None:
    """List the GPU and model profiles (built in, and from $SERVETUNE_SIM_PROFILES)."""
    as_json = use_json(json_out)
    from servetune.logs import emit_json
    from servetune.sim.profiles import available, load_gpu_profile, load_model_profile

    if as_json:  # every field of every profile, by name
        emit_json({"gpu": {name: load_gpu_profile(name) for name in available("gpu")},
                   "model": {name: load_model_profile(name) for name in available("model")}})
        return

    gt = Table(title="GPU profiles")
    for col in ("name", "memory GiB", "bf16 TFLOP/s", "HBM GB/s", "efficiency (compute/memory)"):
        gt.add_column(col)
    for name in available("gpu"):
        g = load_gpu_profile(name)
        gt.add_row(name, f"{g.memory_mib / 1024:.1f}", f"{g.peak_bf16_tflops:g}", f"{g.hbm_bandwidth_gbps:g}",
                   f"{g.compute_efficiency:g} / {g.memory_efficiency:g}")
    mt = Table(title="Model profiles")
    for col in ("name", "params (B)", "layers", "KV heads x dim", "context", "default TP", "vision"):
        mt.add_column(col)
    for name in available("model"):
        m = load_model_profile(name)
        vision = f"{m.vision.min_tokens}-{m.vision.max_tokens} tokens/image" if m.vision else "-"
        mt.add_row(name, f"{m.params_billion:g}", str(m.num_layers), f"{m.num_kv_heads} x {m.head_dim}",
                   str(m.context_length), str(m.tp_size), vision)
    out = Console()
    out.print(gt)
    out.print(mt)


def _refuse(message: str, usage: bool = True) -> NoReturn:
    """argparse's error: SGLang's wording and exit code 2 (servetune.engines.failures reads it), on one line."""
    hint = " (see: servetune sim serve --help)" if usage else ""
    console.print(f"[red]error:[/red] {escape(' '.join(message.split()))}{hint}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    app.add_typer(sim_app, name="sim")
