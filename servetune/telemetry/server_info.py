"""What the server says about itself: version and resolved arguments, for the fingerprint.

SGLang answers ``/server_info`` (``/get_server_info`` before 0.5); vLLM answers ``/version`` and
``/v1/models``. Secrets among the server's arguments (``api_key``...) are dropped here, before
anything is logged or stored.
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import orjson

from servetune.limits import MAX_JSON_BYTES, ResponseTooLarge, read_body
from servetune.telemetry.redact import redact

log = logging.getLogger(__name__)


async def _get_json(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str]
) -> tuple[Any, str | None]:
    try:
        async with session.get(url, headers=headers) as resp:
            if resp.status != 200:
                return None, f"GET {url}: HTTP {resp.status}"
            return orjson.loads(await read_body(resp, MAX_JSON_BYTES, f"GET {url}")), None
    except ResponseTooLarge as exc:
        return None, str(exc)
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
        return None, f"GET {url}: {type(exc).__name__}: {exc}"


async def fetch_server_info(
    url: str, api_key: str | None = None, *, timeout_s: float = 5.0
) -> dict[str, Any]:
    """The server's self-description, secrets removed; ``{"reason": ...}`` when it gives none.

    Result keys: ``engine`` (sglang | vllm | openai), ``version``, ``source`` (the endpoint), and
    for SGLang every resolved server argument plus ``internal_states``; for vLLM ``models``.
    """
    base = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    reasons: list[str] = []
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for path in ("/server_info", "/get_server_info"):
            data, why = await _get_json(session, base + path, headers)
            if isinstance(data, dict):
                return {"engine": "sglang", "source": path} | redact(data)
            reasons.append(why or f"GET {base}{path}: not a JSON object")
        version, why_v = await _get_json(session, base + "/version", headers)
        models, why_m = await _get_json(session, base + "/v1/models", headers)
        if isinstance(version, dict) or isinstance(models, dict):
            info: dict[str, Any] = {
                "engine": "vllm" if isinstance(version, dict) else "openai",
                "source": "/version",
            }
            if isinstance(version, dict):
                info |= redact(version)
            if isinstance(models, dict):
                info["models"] = redact(models.get("data", []))
            return info
        reasons += [r for r in (why_v, why_m) if r]
    reason = "; ".join(reasons)
    log.info("no server info from %s: %s", base, reason)
    return {"reason": reason}
