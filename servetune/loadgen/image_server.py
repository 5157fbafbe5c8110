"""Images served over HTTP from the client's host, as clients that upload images and send their URLs do.

The workload's images are built as base64 ``data:`` URLs; with ``Target.images_over_http`` the load generator
serves each distinct image once from a small HTTP server for the length of the load and sends its
``http://HOST:PORT/images/<sha256>.<ext>`` URL instead. The request body shrinks to a few hundred bytes and
the engine fetches (and decodes) the image itself, which moves that cost from the JSON front end to the
engine's image loader. ``HOST`` must be an address the engine can reach (loopback for a local runner).
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import replace
from typing import Any

from aiohttp import web

from servetune.workload.request import WorkloadRequest


class ImageServer:
    """Serves the images of a list of requests at stable URLs on ``host`` (an ephemeral port)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host, self.port = host, port
        self.images: dict[str, tuple[bytes, str]] = {}  # name -> (bytes, content type)
        self.served = 0
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/images/"

    async def start(self) -> ImageServer:
        app = web.Application()
        app.router.add_get("/images/{name}", self._get)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _get(self, request: web.Request) -> web.Response:
        found = self.images.get(request.match_info["name"])
        if found is None:
            raise web.HTTPNotFound()
        self.served += 1
        return web.Response(body=found[0], content_type=found[1])

    def url_for(self, data_url: str) -> str:
        """The URL this server gives a ``data:`` image (registered once per distinct content)."""
        head, sep, payload = data_url.partition(",")
        if not data_url.startswith("data:") or not sep or ";base64" not in head:
            return data_url  # already a URL: sent as it is
        raw = base64.b64decode(payload)
        ctype = head[5:].split(";", 1)[0] or "application/octet-stream"
        name = hashlib.sha256(raw).hexdigest()[:32] + "." + ctype.rsplit("/", 1)[-1]
        self.images.setdefault(name, (raw, ctype))
        return self.base_url + name

    def rewrite(self, requests: list[WorkloadRequest]) -> list[WorkloadRequest]:
        """The same requests with their images as this server's URLs."""
        return [replace(r, images=[self.url_for(u) for u in r.images],
                        history_images=[[self.url_for(u) for u in turn] for turn in r.history_images])
                if r.all_images else r for r in requests]

    def stats(self) -> dict[str, Any]:
        return {"images": len(self.images), "bytes": sum(len(b) for b, _ in self.images.values()),
                "fetches": self.served, "base_url": self.base_url}
