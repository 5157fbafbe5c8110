"""Bounds on what comes from the network (docs/reliability.md, "Inputs from outside are bounded").

A streamed response is bounded by servetune.loadgen.bounded (its reads dropped past MAX_RESPONSE_BYTES); a
response read whole (an engine's /health, /metrics, /server_info, /flush_cache) through ``read_body``, with
a limit per endpoint: past it the call fails with ``ResponseTooLarge`` naming the endpoint and the limit, as
any other failure of that call does (the trial goes on without it).
"""

from __future__ import annotations

from typing import Any

#: the most one streamed response may hold: 4x a 128k-token stream of chat chunks with usage on each (~250 B a token)
MAX_RESPONSE_BYTES = 128 << 20
MAX_METRICS_BYTES = 16 << 20  #: a Prometheus /metrics page (SGLang's: ~100 KB)
MAX_JSON_BYTES = 4 << 20  #: /server_info, /v1/models, /version
MAX_SMALL_BYTES = 64 << 10  #: /health, /flush_cache: a status, not a document
ERROR_BODY_BYTES = 2048  #: what a request's record keeps of an error's body; the rest is not read


class ResponseTooLarge(ValueError):
    """A response longer than its endpoint's limit: cut, never buffered whole."""


def mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n / 1024:g} KiB"


async def read_body(resp: Any, limit: int, what: str) -> bytes:
    """An aiohttp response's body, at most ``limit`` bytes; past it ``ResponseTooLarge`` naming ``what``."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            raise ResponseTooLarge(f"{what}: the response passed {mib(limit)}, the most it may hold")
        chunks.append(chunk)
    return b"".join(chunks)
