"""Deterministic synthetic images for VLM workloads, as ``data:`` URLs.

Each image is a seeded low-resolution colour field upscaled smoothly plus seeded shapes: distinct
per seed (so the server's image cache only hits when the spec asks for a pool) and small to
encode, since a vision encoder's cost depends on the size, not on the content.
"""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image, ImageDraw

_MIME = {"png": "image/png", "jpeg": "image/jpeg"}


def render_image(seed: tuple[int, ...], width: int, height: int) -> Image.Image:
    rng = np.random.default_rng(list(seed))
    grid = rng.integers(0, 256, size=(6, 6, 3), dtype=np.uint8)
    img = Image.fromarray(grid, "RGB").resize((width, height), Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 8))):
        x0, x1 = sorted(rng.integers(0, width, size=2).tolist())
        y0, y1 = sorted(rng.integers(0, height, size=2).tolist())
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        if rng.random() < 0.5:
            draw.rectangle((x0, y0, x1, y1), fill=colour)
        else:
            draw.ellipse((x0, y0, x1, y1), outline=colour, width=max(1, min(width, height) // 64))
    return img


def image_data_url(seed: tuple[int, ...], width: int, height: int, fmt: str) -> str:
    """``data:image/...;base64,...`` of the image for ``seed``."""
    buf = io.BytesIO()
    img = render_image(seed, width, height)
    if fmt == "jpeg":
        img.save(buf, format="JPEG", quality=90)
    else:
        img.save(buf, format="PNG", optimize=False)
    return f"data:{_MIME[fmt]};base64,{base64.b64encode(buf.getvalue()).decode('ascii')}"


def decode_data_url(url: str) -> Image.Image:
    """Inverse of :func:`image_data_url` (for tests and checks)."""
    header, _, payload = url.partition(",")
    if not header.startswith("data:image/") or ";base64" not in header:
        raise ValueError(f"not a base64 image data URL: {header[:40]!r}")
    return Image.open(io.BytesIO(base64.b64decode(payload)))
