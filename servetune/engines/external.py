"""An endpoint we do not launch: only measured, never started or torn down."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from servetune.engines.catalog import FlagError
from servetune.engines.common import EngineBase
from servetune.loadgen.config import HttpBaseUrl


class ExternalConfig(EngineBase):
    kind: Literal["external"] = "external"
    url: HttpBaseUrl = Field(description="base URL, e.g. http://10.0.0.5:30000")
    model: str | None = Field(default=None, description="model name requests carry")
    health_paths: tuple[str, ...] = ("/health_generate", "/health")
    info_paths: tuple[str, ...] = ("/server_info", "/v1/models")
    ready_timeout_s: float = Field(default=30.0, gt=0)

    display_name = "external"
    cli_options = frozenset({"url", "ready_timeout_s"})
    cli_needs_model = False

    @property
    def launches(self) -> bool:
        return False

    @property
    def endpoint_url(self) -> str | None:
        return self.url

    @property
    def served_model(self) -> str | None:
        return self.model

    def launch_argv(self, *, host: str, port: int) -> list[str]:
        raise TypeError("an external endpoint is not launched by servetune")

    def describe(self) -> str:
        return f"external {self.url}"

    @classmethod
    def cli_data(cls, model: str | None, pairs: dict[str, str], fields: dict[str, Any]) -> dict[str, Any]:
        if pairs:
            raise FlagError("an external endpoint takes no --set flags (it is not launched by servetune)")
        return {"kind": "external", **fields}
