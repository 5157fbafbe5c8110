"""The simulator's tokenizer convention: one whitespace-separated word is one token.

The workload generator without a tokenizer writes exactly one word per requested token, so
counting words reproduces the requested lengths; the words themselves serve as token ids, so
the radix cache matches shared prefixes exactly as token ids would. Chat requests add a fixed template overhead
per message (``MESSAGE_TOKENS``) plus the assistant header (``GENERATION_PROMPT_TOKENS``), the
shape of a Llama-3 chat template. Images become a run of pad tokens whose id is derived from
the image's content hash (as SGLang pads image tokens with a hash-derived value), so a repeated
image is a cache hit; their count comes from the model profile and the image's pixel size.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from collections.abc import Iterable, Sequence
from functools import lru_cache

from PIL import Image, UnidentifiedImageError

from .profiles import ModelProfile

MESSAGE_TOKENS = 4  # <|start_header_id|> role <|end_header_id|> ... <|eot_id|>
GENERATION_PROMPT_TOKENS = 3  # <|start_header_id|> assistant <|end_header_id|>


class BadImage(ValueError):
    """An image the simulated server cannot read: a 400 for the client, as SGLang answers one."""


def token_id(piece: str) -> str:
    """A token "id" is the word itself: equality is all the radix cache needs, and str hashes are cached."""
    return piece


def text_tokens(text: str) -> list[str]:
    return text.split()


@lru_cache(maxsize=4096)
def image_info(url: str) -> tuple[str, int, int]:
    """(content hash, width, height) of a ``data:`` image URL; pixels are not decoded."""
    if not url.startswith("data:"):
        raise BadImage(f"only data: image URLs are supported by the simulator, got {url[:40]!r}")
    head, sep, payload = url.partition(",")
    if not sep or ";base64" not in head:
        raise BadImage("image data URL must be base64 (data:image/...;base64,...)")
    try:
        raw = base64.b64decode(payload, validate=False)
        with Image.open(io.BytesIO(raw)) as im:
            width, height = im.size
    except (binascii.Error, UnidentifiedImageError, OSError) as exc:
        raise BadImage(f"cannot read image: {exc}") from exc
    return hashlib.sha256(raw).hexdigest()[:32], width, height


class Prompt:
    """Token ids of one prompt, with where its image runs are and each image's pixel count (front end)."""

    __slots__ = ("ids", "images", "pixels")

    def __init__(self) -> None:
        self.ids: list[int | str] = []
        self.images: list[tuple[int, int]] = []
        self.pixels: list[int] = []

    def add_text(self, text: str) -> None:
        self.ids.extend(text_tokens(text))

    def add_piece(self, piece: str) -> None:
        self.ids.append(token_id(piece))

    def add_image(self, url: str, model: ModelProfile) -> None:
        digest, w, h = image_info(url)
        n = model.image_tokens(w, h)
        markers = model.vision.marker_tokens if model.vision else 0
        self.ids.extend(["<|vision_start|>"] * (markers // 2))
        self.images.append((len(self.ids), n))
        self.ids.extend([token_id("<img:" + digest + ">")] * n)
        self.ids.extend(["<|vision_end|>"] * (markers - markers // 2))
        self.pixels.append(w * h)


def chat_prompt(messages: Sequence[dict], model: ModelProfile) -> Prompt:
    """OpenAI chat messages (string or content-part list) -> token ids with the template overhead."""
    p = Prompt()
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise ValueError(f"messages[{i}] must be an object")
        role = str(msg.get("role", "user"))
        p.add_piece("<|start_header_id|>")
        p.add_piece(f"<|role:{role}|>")
        p.add_piece("<|end_header_id|>")
        content = msg.get("content")
        if isinstance(content, str):
            p.add_text(content)
        elif isinstance(content, list):
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text":
                    p.add_text(str(part.get("text", "")))
                elif kind == "image_url":
                    url = part.get("image_url")
                    url = url.get("url") if isinstance(url, dict) else url
                    if not isinstance(url, str):
                        raise ValueError(f"messages[{i}].content[{j}].image_url.url missing")
                    p.add_image(url, model)
                else:
                    raise ValueError(f"messages[{i}].content[{j}]: unsupported part type {kind!r}")
        elif content is not None:
            raise ValueError(f"messages[{i}].content must be a string or a list of parts")
        p.add_piece("<|eot_id|>")
    p.add_piece("<|start_header_id|>")
    p.add_piece("<|role:assistant|>")
    p.add_piece("<|end_header_id|>")
    return p


def text_prompt(text: str, images: Iterable[str], model: ModelProfile) -> Prompt:
    """A raw prompt (/v1/completions, /generate); images (``image_data``) come first."""
    p = Prompt()
    for url in images:
        p.add_image(url, model)
    p.add_text(text)
    return p


_OUT_WORDS = (
    "the of and to in is was for on that with as by at from it an be this which or are were not "
    "but had have has its one all their there been more when who will would can said each about"
).split()


def output_word(rid: int, k: int) -> str:
    """The k-th generated word of request ``rid``: any word, one token each."""
    return _OUT_WORDS[(rid * 7 + k * 13) % len(_OUT_WORDS)]


def output_text(rid: int, start: int, end: int) -> str:
    """Generated text for tokens [start, end): words joined so every word stays one token."""
    words = [output_word(rid, k) for k in range(start, end)]
    text = " ".join(words)
    return text if start == 0 else " " + text
