"""What to load and how hard: the target endpoint and the arrival process.

The API key is deliberately NOT a field: only the *name* of the environment variable
travels in configs, results and logs; the secret is read at run time by ``api_key()``.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

Endpoint = Literal["chat", "completions", "generate"]

ENDPOINT_PATHS: dict[str, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "generate": "/generate",
}


def http_base_url(v: str) -> str:
    """An http(s)://host[:port] base URL without a trailing slash, or a ValueError saying what is wrong."""
    parts = urlsplit(v)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"url must be http(s)://host[:port], got {v!r}")
    try:
        port = parts.port
    except ValueError:  # Python's own text ("Port out of range 0-65535") names neither the URL nor the rule
        port = 0
    if port == 0:
        from servetune.redact import redact_url

        raise ValueError(f"url's port must be a number from 1 to 65535, got {redact_url(v)!r}")
    extra = [what for what, there in (("a path", parts.path.strip("/")), ("a query string", parts.query or "?" in v),
                                      ("a fragment", parts.fragment or "#" in v)) if there]
    if extra:  # a path would 404 every request; a query string silently broke the cache flush and /metrics
        from servetune.redact import redact_url

        shown = redact_url(v.split("?")[0].split("#")[0]) + ("?..." if "?" in v else "") + ("#..." if "#" in v else "")
        raise ValueError(f"url has {' and '.join(extra)}, got {shown!r}: give the server's base URL, e.g. "
                         "http://host:port; servetune adds /v1/chat/completions itself")
    return v.rstrip("/")


HttpBaseUrl = Annotated[str, AfterValidator(http_base_url)]


class Target(BaseModel):
    """A serving endpoint to stream from."""

    model_config = ConfigDict(extra="forbid")

    url: HttpBaseUrl = Field(description="base URL, e.g. http://127.0.0.1:30000 (no endpoint path)")
    endpoint: Endpoint = "chat"
    model: str | None = None
    api_key_env: str = "SERVETUNE_API_KEY"
    timeout_s: float = Field(default=600.0, gt=0, description="per request, whole stream included")
    idle_timeout_s: float | None = Field(
        default=60.0, gt=0, description="fail a request whose stream sends no byte for this long "
                                        "(waiting for the first byte included); None: only timeout_s")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="merged into every request body")
    ignore_eos: bool = Field(default=True, description="ask for exactly max_tokens (sent only when true: "
                                                       "some OpenAI servers reject the field)")
    temperature: float = Field(default=0.0, ge=0)
    http_client: Literal["auto", "raw", "aiohttp"] = Field(
        default="auto", description="auto: the raw HTTP/1.1 client (loadgen/rawhttp.py, the least CPU per chunk)"
                                    " for http:// targets, aiohttp for https://")

    images_over_http: bool = Field(
        default=False, description="serve the workload's images from an HTTP server on image_host for the load and"
                                   " send their URLs, not base64 data URLs (servetune.loadgen.image_server)")
    image_host: str = Field(default="127.0.0.1", description="the address the image server binds and the engine"
                                                             " fetches from (loopback: an engine on this host)")
    read_batch_ms: float = Field(
        default=1.0, ge=0, le=2.0,
        description="the raw client reads its sockets at most once per this many ms (the kernel stamps each read's"
                    " arrival, so the stamps stay exact; a request a stream's end lets out goes up to this late);"
                    " 0: read each chunk as it comes. Kept below real engines' inter-token gaps (2 ms at most)."
                    " Without kernel stamps (not Linux) reads are never batched")

    @field_validator("http_client")
    @classmethod
    def _raw_is_plain_http(cls, v: str, info: ValidationInfo) -> str:
        if v == "raw" and not str(info.data.get("url", "")).startswith("http://"):
            raise ValueError("the raw client speaks plain http:// only (use auto or aiohttp for https)")
        return v

    @property
    def request_path(self) -> str:
        return ENDPOINT_PATHS[self.endpoint]

    @property
    def request_url(self) -> str:
        return self.url + ENDPOINT_PATHS[self.endpoint]

    def api_key(self) -> str | None:
        """The secret, read now from ``api_key_env`` (falling back to OPENAI_API_KEY); never stored."""
        return os.environ.get(self.api_key_env) or os.environ.get("OPENAI_API_KEY") or None


class LoadConfig(BaseModel):
    """Closed loop at a fixed concurrency, waves of ``concurrency`` requests (static batching), or open loop at
    a rate with a cap on in-flight requests."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["concurrency", "rate", "waves"] = "concurrency"
    concurrency: int = Field(gt=0, description="closed-loop streams; in waves mode the wave size B; in rate mode"
                                               " the in-flight cap")
    # arrival before rate: the rate's check reads it (a trace brings its own timing, so needs no rate)
    arrival: Literal["constant", "poisson", "gamma", "trace"] = Field(
        default="poisson", description="trace: the requests' own arrival_s (a workload with a trace), rescaled"
                                       " to ``rate`` when it is set")
    rate: float | None = Field(
        default=None, gt=0, validate_default=True, description="requests/s, required in rate mode (but for a trace)"
    )
    burstiness: float = Field(default=1.0, gt=0, description="gamma shape: <1 burstier, >1 smoother")
    exact_rate: bool = Field(
        default=False, description="rescale the sampled gaps so the schedule's mean rate is exactly ``rate``"
                                   " (the gaps keep their shape); the tuner's levels are rates, so it sets it")
    warmup_requests: int = Field(default=0, ge=0)
    prime_cache: bool = Field(default=True, description="before the warm-up, one short request per shared system"
                                                        " prompt and pooled image the measured requests use"
                                                        " (servetune/loadgen/priming.py)")
    seed: int = 0

    @field_validator("rate")
    @classmethod
    def _rate_for_rate_mode(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is None and info.data.get("mode") == "rate" and info.data.get("arrival") != "trace":
            raise ValueError("required when mode is 'rate' (requests per second)")
        return v
