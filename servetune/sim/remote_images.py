"""The simulated server fetches ``http(s)://`` image URLs as SGLang's image loader does, then reads them like
``data:`` ones: a client may send URLs (servetune.loadgen.image_server) instead of base64 payloads."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import aiohttp

from servetune.sim.tokens import BadImage

MAX_IMAGE_BYTES = 64 << 20


def _image_url(part: Any) -> str | None:
    """The URL of an ``image_url`` content part (None for any other part)."""
    url = part.get("image_url") if isinstance(part, dict) and part.get("type") == "image_url" else None
    url = url.get("url") if isinstance(url, dict) else url
    return url if isinstance(url, str) else None


def _parts(msg: Any) -> list[Any]:
    content = msg.get("content") if isinstance(msg, dict) else None
    return content if isinstance(content, list) else []


def _remote_urls(messages: Sequence[Any]) -> list[str]:
    return [url for msg in messages for part in _parts(msg)
            if (url := _image_url(part)) is not None and url.startswith(("http://", "https://"))]


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

    def swapped(part: Any) -> Any:
        url = _image_url(part)
        return {"type": "image_url", "image_url": {"url": fetched[url]}} if url in fetched else part

    return [{**msg, "content": [swapped(p) for p in _parts(msg)]} if _parts(msg) else msg for msg in messages]
