"""The simulated SGLang (``servetune sim serve``): same flags and endpoints, a model instead of a GPU.

Flags are checked twice before launch: against the SGLang catalogue (they must be real SGLang
flags) and against the simulator's own parser (it models a subset; a flag it ignores would make a
simulated number look like it answered a question it did not).
"""

from __future__ import annotations

import sys
from typing import Any, Literal

from pydantic import Field, model_validator

from servetune.engines.catalog import Catalog, FlagError, FlagValue, load_catalog
from servetune.engines.common import EngineBase
from servetune.engines.sglang import ALWAYS_ON, DEFAULT_VERSION, SGLangFlagsMixin, validate_flags


def _sim_parser_error(argv: list[str]) -> str | None:
    """What the simulator's own parser says about ``argv`` (None: accepted, or simulator not importable)."""
    try:
        from servetune.sim.args import build_parser
    except ImportError:
        return None
    parser = build_parser()
    modelled = {s for a in parser._actions for s in a.option_strings}
    unmodelled = [a for a in argv if a.startswith("--") and a not in modelled]
    if unmodelled:
        return f"{unmodelled[0]} is an SGLang flag the simulator does not model"

    def _raise(message: str) -> None:
        raise FlagError(message)

    parser.error = _raise  # type: ignore[method-assign]
    try:
        parser.parse_args(argv)
    except FlagError as exc:
        return str(exc)
    return None


class SimConfig(SGLangFlagsMixin, EngineBase):
    kind: Literal["sim"] = "sim"
    model_profile: str = Field(default="llama-3.1-8b", description="simulator model profile name or YAML path")
    gpu_profile: str = Field(default="H100-80G", description="simulator GPU profile name or YAML path")
    version: str = Field(default=DEFAULT_VERSION, description="SGLang version whose flags the simulator speaks")
    python: str = Field(default_factory=lambda: sys.executable, description="interpreter with servetune")
    load_seconds: float | None = Field(default=None, ge=0, description="simulated weight-loading time")
    args: dict[str, FlagValue] = Field(default_factory=dict, description="SGLang flags: name -> value")

    health_paths: tuple[str, ...] = ("/health_generate",)
    info_paths: tuple[str, ...] = ("/server_info",)

    display_name = "sim"
    cli_options = frozenset({"python", "version", "gpu_profile", "ready_timeout_s"})
    cli_needs_model = False

    @model_validator(mode="after")
    def _flags_known(self) -> SimConfig:
        self.args = validate_flags(self.catalog, self.args)
        problem = _sim_parser_error(self.catalog.to_argv(self.args))
        if problem:
            raise FlagError(f"{problem} (sim of sglang {self.version})")
        return self

    @property
    def catalog(self) -> Catalog:
        return load_catalog("sglang", self.version)

    @property
    def served_model(self) -> str | None:
        name = self.args.get("served-model-name") or self.args.get("model-path")
        return str(name) if name else None

    def launch_argv(self, *, host: str, port: int) -> list[str]:
        flags = {k: v for k, v in self.args.items() if k not in ALWAYS_ON}
        argv = [self.python, "-m", "servetune", "sim", "serve", "--model-profile", self.model_profile,
                "--gpu-profile", self.gpu_profile, "--host", host, "--port", str(port)]
        if self.load_seconds is not None:
            argv += ["--load-seconds", str(self.load_seconds)]
        return argv + [f"--{f}" for f in ALWAYS_ON] + self.catalog.to_argv(flags)

    def describe(self) -> str:
        return f"sim {self.model_profile} on {self.gpu_profile}"

    @classmethod
    def cli_data(cls, model: str | None, pairs: dict[str, str], fields: dict[str, Any]) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": "sim", "args": pairs, **fields}
        if model:
            data["model_profile"] = model  # --model names the simulator's model profile
        return data
