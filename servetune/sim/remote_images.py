"""The simulated server fetches ``http(s)://`` image URLs as SGLang's image loader does, then reads them like
``data:`` ones: a client may send URLs (servetune.loadgen.image_server) instead of base64 payloads."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import aiohttp

from servetune.sim.tokens import BadImage

MAX_IMAGE_BYTES = 64 << 20


def _remote_urls(messages: Sequence[Any]) -> list[str]:
    urls = []
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        for part in content if isinstance(content, list) else ():
            url = part.get("image_url") if isinstance(part, dict) and part.get("type") == "image_url" else None
            url = url.get("url") if isinstance(url, dict) else url
            if isinstance(url, str) and url.startswith(("http://", "https://")):
                urls.append(url)
    return urls


async def fetch_as_data_urls(urls: Sequence[str], timeout_s: float = 30.0) -> dict[str, str]:
    """url -> ``data:`` URL of what it served; ``BadImage`` naming the URL when it cannot be fetched."""
    out: dict[str, str] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        for url in dict.fromkeys(urls):
            try:
                async with session.get(url) as resp:
                    if resp.status != 200:
                        raise BadImage(f"cannot fetch image {url}: HTTP {resp.status}")
                    raw = await resp.content.read(MAX_IMAGE_BYTES + 1)
                    ctype = resp.content_type or "image/png"
            except aiohttp.ClientError as exc:
                raise BadImage(f"cannot fetch image {url}: {exc}") from exc
            if len(raw) > MAX_IMAGE_BYTES:
                raise BadImage(f"image {url} is larger than {MAX_IMAGE_BYTES >> 20} MiB")
            out[url] = f"data:{ctype};base64," + base64.b64encode(raw).decode()
    return out


async def inline_remote_images(messages: list[Any]) -> list[Any]:
    """``messages`` with every http(s) image URL replaced by the data URL of what it served."""
    urls = _remote_urls(messages)
    if not urls:
        return messages
    fetched = await fetch_as_data_urls(urls)
    out = []
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        if not isinstance(content, list):
            out.append(msg)
            continue
        parts = []
        for part in content:
            url = part.get("image_url") if isinstance(part, dict) and part.get("type") == "image_url" else None
            url = url.get("url") if isinstance(url, dict) else url
            parts.append({"type": "image_url", "image_url": {"url": fetched[url]}} if url in fetched else part)
        out.append({**msg, "content": parts})
    return out
