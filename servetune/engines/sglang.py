"""SGLang: ``python -m sglang.launch_server`` with flags checked against the catalogue of its version.

Flags are kept as ``{name: typed value}`` and turned into argv only at launch. Metrics and the
cache report are always on: without them a trial cannot state its prefix hit rate.

Two checks, both before a GPU is touched: at plan time against the shipped catalogue nearest the
planned version (no version: the newest), then on the runner by its own SGLang's parser, whose
catalogue is cached for that version and used from then on (``adopt_runner_version``).
"""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from servetune.engines.catalog import Catalog, FlagError, FlagValue, cache_runner_catalog, catalog_for
from servetune.engines.common import EngineBase, Flags, FlagValue as _FlagValue, TuningKnobs
from servetune.redact import split_secret_flags

log = logging.getLogger("servetune.runners.lifecycle")  # where its launch messages always appeared
DEFAULT_VERSION = "0.5.23"
ALWAYS_ON = ("enable-metrics", "enable-cache-report")
#: set by servetune itself (model from --model, host/port from the runner): never through --set
RESERVED = ("model-path", "host", "port")
PROBE_PATH = Path(__file__).parent / "catalog" / "sglang_probe.py"
#: the file SGLang reads its secret flags from (``--config``, SGLang >= 0.5.5), 0600 on the runner
SECRETS_FILE = "sglang-secrets.yaml"


#: SGLang's knobs as the tuner walks them (the simulator speaks the same flags): chunked prefill, then the
#: scheduler's conservativeness (the tuning guide's order), the running-request cap last
SGLANG_TUNING = TuningKnobs(
    grid={"chunked-prefill-size": (1024, 2048, 4096, 8192), "schedule-conservativeness": (0.3, 0.7, 1.0, 1.3)},
    max_running="max-running-requests", prefix_cache_off="disable-radix-cache", schedule_policy="schedule-policy",
    directions={"chunked-prefill-size": "chunk", "schedule-conservativeness": "conservativeness"},
)


class SGLangFlagsMixin:
    """SGLang and its simulator: the launch flags are ``args``, and ``--set`` pairs are SGLang flags."""

    display_name = "SGLang"
    metric_prefix = "sglang:"
    tuning = SGLANG_TUNING

    def flags(self) -> Flags:
        return dict(self.args)  # type: ignore[attr-defined]

    def flag_fields(self, flags: Mapping[str, _FlagValue | None]) -> dict[str, Any]:
        return {"args": dict(flags)}

    def gpus_needed(self) -> int | None:
        """tp-size x dp-size (SGLang's defaults: 1 each): one GPU per tensor-parallel rank per replica."""
        a = self.args  # type: ignore[attr-defined]
        tp = a.get("tp-size", a.get("tensor-parallel-size", 1))
        dp = a.get("dp-size", a.get("data-parallel-size", 1))
        try:
            return int(tp or 1) * int(dp or 1)
        except (TypeError, ValueError):
            return None  # the flag's own check names the bad value


def validate_flags(catalog: Catalog, args: Mapping[str, FlagValue], *, reserved: Sequence[str] = RESERVED,
                   ) -> dict[str, FlagValue]:
    """Canonical names and typed values; unknown, removed or reserved flags raise ``FlagError``."""
    out: dict[str, FlagValue] = {}
    for name, value in args.items():
        flag, typed = catalog.coerce(name, value)
        if flag in reserved:
            raise FlagError(f"--{flag} is set by servetune (model from --model, host/port from the runner), "
                            f"not through flags ({catalog.label})")
        if flag in ALWAYS_ON and typed is False:
            raise FlagError(f"--{flag} cannot be turned off: trials need it ({catalog.label})")
        if flag in out:
            raise FlagError(f"--{flag} given twice ({catalog.label})")
        out[flag] = typed
    return out


class SGLangConfig(SGLangFlagsMixin, EngineBase):
    kind: Literal["sglang"] = "sglang"
    model: str = Field(description="model path (or hub id) as SGLang's --model-path takes it")
    version: str | None = Field(default=None, description="the SGLang version the flags are written for; unset: "
                                "the newest shipped catalogue checks them, the runner's own parser decides")
    python: str = Field(default="python3", description="interpreter on the runner where sglang is installed")
    args: dict[str, FlagValue] = Field(default_factory=dict, description="SGLang flags: name -> value")
    parser_check: bool = Field(default=True, description="before launch, parse the flags with the runner's SGLang")

    health_paths: tuple[str, ...] = ("/health_generate",)
    info_paths: tuple[str, ...] = ("/server_info", "/get_server_info")

    cli_options = frozenset({"python", "version", "ready_timeout_s"})
    model_from_plan = True

    @field_validator("model")
    @classmethod
    def _model_given(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("model must name a model path")
        return v

    @model_validator(mode="after")
    def _flags_known(self) -> SGLangConfig:
        self.args = validate_flags(self.catalog, self.args)
        return self

    @property
    def catalog(self) -> Catalog:
        return catalog_for("sglang", self.version)

    @property
    def served_model(self) -> str | None:
        name = self.args.get("served-model-name")
        return str(name) if name else self.model

    def server_args_argv(self, *, host: str, port: int) -> list[str]:
        """The launch flags (what SGLang's parser sees), without the interpreter."""
        flags = {k: v for k, v in self.args.items() if k not in ALWAYS_ON}
        return (["--model-path", self.model, "--host", host, "--port", str(port)]
                + [f"--{f}" for f in ALWAYS_ON] + self.catalog.to_argv(flags))

    def launch_argv(self, *, host: str, port: int) -> list[str]:
        return [self.python, "-m", "sglang.launch_server", *self.server_args_argv(host=host, port=port)]

    def parser_check_argv(self, *, host: str, port: int) -> list[str]:
        """A command that asks the runner's installed SGLang to parse our flags (no GPU, no model load)."""
        return [self.python, "-c", PROBE_PATH.read_text(), "check", *self.server_args_argv(host=host, port=port)]

    def describe(self) -> str:
        return f"sglang {self.version or '(the runner’s version)'} {self.model}"

    # --- secrets: SGLang reads no such variable, so they go to a YAML file it loads with --config
    def secure_launch(self, argv: list[str]) -> tuple[list[str], dict[str, str], dict[str, str]]:
        env = dict(self.env)
        kept, secrets = split_secret_flags(argv)
        if secrets and any(t == "--config" or t.startswith("--config=") for t in kept):
            log.warning("sglang --config is set: its secret flags (%s) stay on the command line", ", ".join(secrets))
        elif secrets:
            import yaml

            return kept, env, {SECRETS_FILE: yaml.safe_dump(secrets, default_flow_style=False)}
        return argv, env, {}

    def secret_files_argv(self, paths: Mapping[str, str]) -> list[str]:
        return ["--config", paths[SECRETS_FILE]] if SECRETS_FILE in paths else []

    # --- the runner's own SGLang parses the flags before launch (``parser_check``)
    def runner_check_argv(self, *, host: str, port: int) -> list[str] | None:
        return self.parser_check_argv(host=host, port=port) if self.parser_check else None

    def read_runner_check(self, returncode: int, stdout: str, stderr: str) -> ParserVerdict:
        return interpret_parser_check(returncode, stdout, stderr, self.version)

    def adopt_runner_check(self, verdict: ParserVerdict) -> SGLangConfig:
        return adopt_runner_version(self, verdict)

    # --- servetune serve
    @classmethod
    def cli_resolve(cls, fields: dict[str, Any], *, runner: str) -> dict[str, Any]:
        if runner == "local" and fields.get("version") is None:  # the runner's own (None: the newest catalogued)
            fields = {**fields, "version": installed_version(fields.get("python") or "python3")}
        return fields

    @classmethod
    def cli_data(cls, model: str | None, pairs: dict[str, str], fields: dict[str, Any]) -> dict[str, Any]:
        return {"kind": "sglang", "model": model, "args": pairs, **fields}


@dataclass(frozen=True)
class ParserVerdict:
    """What SGLang's own parser on the runner said; ``checked`` is False where SGLang is not installed."""

    checked: bool
    ok: bool
    version: str | None = None
    error: str | None = None
    note: str | None = None
    catalog: dict[str, Any] | None = None  # the runner's own flag set (sglang_probe.py's dump)


def interpret_parser_check(returncode: int, stdout: str, stderr: str, planned_version: str | None) -> ParserVerdict:
    """Turn the probe's output into a verdict; an SGLang that is not installed is "not checked", not a pass.

    A runner whose version differs from the plan's is no refusal: its own parser has just accepted the
    flags, which is what the version check stood for; the difference is noted and the runner's version wins.
    """
    line = next((ln for ln in reversed(stdout.strip().splitlines()) if ln.startswith("{")), "")
    try:
        data: dict[str, Any] = json.loads(line) if line else {}
    except ValueError:
        data = {}
    if not data:
        missing = "No module named 'sglang" in stderr or "No such file" in stderr or returncode == 127
        note = ("sglang is not installed there" if missing
                else f"probe failed (exit {returncode}): {stderr.strip()[-300:]}")
        return ParserVerdict(checked=False, ok=False, version=None, error=None, note=note)
    version = data.get("version")
    catalog = data.get("catalog") if isinstance(data.get("catalog"), dict) else None
    note = None
    if version and planned_version and version != planned_version:
        note = f"the plan names sglang {planned_version}, the runner has {version}: its own parser checked the flags"
    return ParserVerdict(checked=True, ok=bool(data.get("ok")), version=version, error=data.get("error"), note=note,
                         catalog=catalog)


def adopt_runner_version(cfg: SGLangConfig, verdict: ParserVerdict) -> SGLangConfig:
    """The config as the runner's SGLang sees it: its version, and its catalogue cached for argv rendering."""
    if not (verdict.checked and verdict.ok and verdict.version):
        return cfg
    if verdict.catalog and verdict.catalog.get("version") == verdict.version:
        cache_runner_catalog(verdict.catalog)
    return cfg.model_copy(update={"version": verdict.version})


def check_with_installed_parser(cfg: SGLangConfig, *, host: str = "127.0.0.1", port: int = 30000,
                                env: Mapping[str, str] | None = None, timeout_s: float = 120.0) -> ParserVerdict:
    """Run the probe locally (the runner's own machine); see ``interpret_parser_check``."""
    try:
        proc = subprocess.run(cfg.parser_check_argv(host=host, port=port), capture_output=True, text=True,
                              timeout=timeout_s, env=None if env is None else dict(env), stdin=subprocess.DEVNULL)
    except FileNotFoundError as exc:
        return ParserVerdict(checked=False, ok=False, version=None, error=None, note=f"no interpreter: {exc}")
    return interpret_parser_check(proc.returncode, proc.stdout, proc.stderr, cfg.version)


def installed_version(python: str, timeout_s: float = 60.0) -> str | None:
    """The SGLang version ``python`` imports, or None: lets ``serve`` type its flags for the local install
    before the parser check (no version named: the runner's own, not the newest catalogued)."""
    code = "from importlib.metadata import version; print(version('sglang'))"
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = proc.stdout.strip()
    return out if proc.returncode == 0 and out else None
