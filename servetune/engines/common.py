"""What every engine config shares: how it is launched, where it says it is ready, what it reports."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class EngineBase(BaseModel):
    """One serving engine's launch configuration; subclasses add their knobs and build the argv."""

    model_config = ConfigDict(extra="forbid")

    env: dict[str, str] = Field(default_factory=dict, description="extra environment for the engine process")
    ready_timeout_s: float = Field(default=900.0, gt=0, description="deadline for the readiness probe")

    #: readiness endpoints, tried in order; the first answering 200 means "serves"
    health_paths: tuple[str, ...] = ("/health",)
    #: endpoints describing the running server (resolved args), tried in order
    info_paths: tuple[str, ...] = ("/server_info",)

    @property
    def launches(self) -> bool:
        """False for an endpoint we only measure (nothing to start or tear down)."""
        return True

    @property
    def served_model(self) -> str | None:
        """The model name requests must carry, when the engine insists on one."""
        return None

    def launch_argv(self, *, host: str, port: int) -> list[str]:
        """The exact command that starts the engine, as an argv list (never a shell string)."""
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__
