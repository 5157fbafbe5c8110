"""What every engine config shares: how it is launched, where it says it is ready, what it reports,
which knobs tuning turns, how ``servetune serve`` builds it, how its log and metrics read.

Each engine module defines one config class (a pydantic model with ``kind`` as its discriminator)
that overrides what differs; ``servetune.engines.registry.ENGINES`` maps kind -> class. Nothing
outside the engine modules asks "which engine is this?": they call these methods.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from servetune.engines.failures import FailureKind

FlagValue = int | float | str | bool  # one server flag's value as a plan writes it
Flags = dict[str, FlagValue | None]  # a trial's server flags, hyphenated names (None: a bare store-true flag)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_name(name: str) -> str:
    """A POSIX environment variable name, or a ValueError (the plan names the key: ``engine.sglang.env.1BAD``)."""
    if not _ENV_NAME.fullmatch(name):
        raise ValueError("not a valid environment variable name (letters, digits and _, not starting with a digit"
                         + (")" if name else "; the name is empty)"))
    return name


EnvName = Annotated[str, AfterValidator(env_name)]


class KnobError(ValueError):
    """A flag the engine kind cannot take through tuning."""


@dataclass(frozen=True)
class TuningKnobs:
    """What the tuner needs to know about an engine's flags; servetune.tuning and the plan ask the engine for
    these and never name an engine's flag themselves (docs/architecture.md, "Adding a tuning knob")."""

    grid: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)  #: the refinement's default grid, in order
    max_running: str | None = None  #: the flag capping running requests (set to the level last); None: none
    prefix_cache_off: str | None = None  #: a flag that turns the prefix cache off (dropped first); None: none
    schedule_policy: str | None = None  #: the flag naming the scheduling policy (prefix-aware ones tried)
    #: grid flag -> the server signal that suggests which way to walk it (servetune.tuning.signals)
    directions: Mapping[str, str] = field(default_factory=dict)
    api_key_env: str | None = None  #: the environment variable the engine reads its API key from


class EngineBase(BaseModel):
    """One serving engine's launch configuration; subclasses add their knobs and build the argv."""

    model_config = ConfigDict(extra="forbid")

    env: dict[EnvName, str] = Field(default_factory=dict, description="extra environment for the engine process")
    ready_timeout_s: float = Field(default=900.0, gt=0, description="deadline for the readiness probe")

    #: readiness endpoints, tried in order; the first answering 200 means "serves"
    health_paths: tuple[str, ...] = ("/health",)
    #: endpoints describing the running server (resolved args), tried in order
    info_paths: tuple[str, ...] = ("/server_info",)

    #: the engine's name in messages ("the runner's SGLang")
    display_name: ClassVar[str] = "engine"
    #: the prefix of its Prometheus families (a key of ``servetune.telemetry.prometheus.DIALECTS``); None: no /metrics
    metric_prefix: ClassVar[str | None] = None
    #: log patterns of this engine's own failures, tried before the shared ones (``failures.py``)
    log_patterns: ClassVar[tuple[tuple[FailureKind, re.Pattern[str]], ...]] = ()
    #: config field -> launch flag, for engines whose flags are typed fields (errors name the flag)
    field_flags: ClassVar[dict[str, str]] = {}
    #: tunable flag (hyphenated, no dashes) -> config field; empty: nothing to tune through fields
    knob_fields: ClassVar[dict[str, str]] = {}
    #: ``servetune serve`` options (config field names) that apply to this engine, and whether --model is required
    cli_options: ClassVar[frozenset[str]] = frozenset({"python", "ready_timeout_s"})
    cli_needs_model: ClassVar[bool] = True
    #: a plan's top-level ``model`` fills ``engine.model`` when the engine section leaves it out
    model_from_plan: ClassVar[bool] = False
    #: what tuning needs to know of its flags (default grid, max-running flag, prefix-cache switch, ...)
    tuning: ClassVar[TuningKnobs] = TuningKnobs()

    @property
    def launches(self) -> bool:
        """False for an endpoint we only measure (nothing to start or tear down)."""
        return True

    def gpus_needed(self) -> int | None:
        """GPUs one server of this config occupies, when its flags say (None: the engine decides)."""
        return None

    @property
    def served_model(self) -> str | None:
        """The model name requests must carry, when the engine insists on one."""
        return None

    @property
    def endpoint_url(self) -> str | None:
        """The base URL of an endpoint that is not launched (None: the runner's host and port)."""
        return None

    def launch_argv(self, *, host: str, port: int) -> list[str]:
        """The exact command that starts the engine, as an argv list (never a shell string)."""
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__

    # --- tuning: one flat {flag: value} view, whatever the engine keeps
    def flags(self) -> Flags:
        """The server-side flags a trial varies (hyphenated names)."""
        return {flag: getattr(self, f) for flag, f in self.knob_fields.items() if getattr(self, f) is not None}

    def flag_fields(self, flags: Mapping[str, FlagValue | None]) -> dict[str, Any]:
        """The config fields that launch with exactly ``flags`` (unset knobs back to the engine's default)."""
        if not self.knob_fields:
            if flags:
                raise KnobError(f"an {self.kind} engine takes no server flags, got {sorted(flags)}")  # type: ignore[attr-defined]
            return {}
        unknown = [k for k in flags if k not in self.knob_fields]
        if unknown:
            raise KnobError(f"{self.display_name} knobs servetune tunes are {sorted(self.knob_fields)}; not {unknown}")
        return {field: flags.get(flag) for flag, field in self.knob_fields.items()}

    # --- launch: secrets off the command line
    def secure_launch(self, argv: list[str]) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """``(argv, env, files)``: secret flags moved where ``ps`` cannot see them (default: left on argv,
        redacted wherever shown)."""
        return argv, dict(self.env), {}

    def secret_files_argv(self, paths: Mapping[str, str]) -> list[str]:
        """The flags that make the engine read the staged secret files (name -> path on the runner)."""
        return []

    # --- the runner's own check of the flags before launch (SGLang's parser); None: no such check
    def runner_check_argv(self, *, host: str, port: int) -> list[str] | None:
        return None

    def read_runner_check(self, returncode: int, stdout: str, stderr: str) -> Any:
        raise NotImplementedError

    def adopt_runner_check(self, verdict: Any) -> EngineBase:
        """The config as the runner's engine sees it (e.g. its version)."""
        return self

    # --- servetune serve
    @classmethod
    def cli_resolve(cls, fields: dict[str, Any], *, runner: str) -> dict[str, Any]:
        """Fill fields a command line leaves out from the runner (e.g. the locally installed version)."""
        return fields

    @classmethod
    def cli_data(cls, model: str | None, pairs: dict[str, str], fields: dict[str, Any]) -> dict[str, Any]:
        """Plain data for the config from ``--model``, ``--set k=v`` pairs and the other options."""
        data: dict[str, Any] = {"kind": cls.model_fields["kind"].default, "model": model, **fields}
        for key, value in pairs.items():
            data[key.replace("-", "_")] = value
        return data
