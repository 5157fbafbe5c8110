"""Per endpoint: the request body we send and how its stream is read back into a RequestRecord.

Bodies are rendered before the run (nothing is serialised on the hot path); streams are
decoded after each request ends, from the timestamped socket reads (sse.py). Per-chunk token
counts follow docs/metrics.md, best source first, and the record says which.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import orjson

from servetune.records import ErrorClass, RequestRecord, TokenCountSource
from servetune.workload.request import WorkloadRequest

from .config import Target
from .sse import json_array, split_events


class TokenCounter(Protocol):
    def count(self, text: str) -> int: ...


def request_body(target: Target, req: WorkloadRequest) -> bytes:
    """The JSON body for one request; ``target.extra_body`` wins (dict values merge one level deep)."""
    body: dict[str, Any]
    if target.endpoint == "generate":
        body = {
            "text": req.prompt_text(),
            "sampling_params": {
                "max_new_tokens": req.output_tokens,
                "temperature": target.temperature,
                "ignore_eos": target.ignore_eos,
            },
            "stream": True,
        }
        if req.all_images:
            body["image_data"] = req.all_images
    else:
        body = (
            {"messages": req.chat_messages()}
            if target.endpoint == "chat"
            else {"prompt": req.prompt_text()}
        )
        body.update(
            max_tokens=req.output_tokens,
            temperature=target.temperature,
            stream=True,
            stream_options={"include_usage": True},
        )
        if target.ignore_eos:
            body["ignore_eos"] = True
        if target.model is not None:
            body["model"] = target.model
    for key, value in target.extra_body.items():
        if isinstance(value, dict) and isinstance(body.get(key), dict):
            body[key] = {**body[key], **value}
        else:
            body[key] = value
    return orjson.dumps(body)


def token_counter(tokenizer: Any) -> Callable[[str], int] | None:
    """Accept an object with ``count(text)`` or ``encode(text)`` (e.g. a tokenizers.Tokenizer)."""
    if tokenizer is None:
        return None
    if callable(getattr(tokenizer, "count", None)):
        return tokenizer.count
    encode = getattr(tokenizer, "encode", None)
    if callable(encode):
        return lambda text: len(encode(text))
    raise TypeError(f"tokenizer {type(tokenizer).__name__} has neither count(text) nor encode(text)")


class _Stream:
    """What one stream said, before it is written into the record."""

    __slots__ = ("times", "texts", "usage_tokens", "usage", "meta", "error")

    def __init__(self) -> None:
        self.times: list[int] = []  # content chunk arrival, perf_counter_ns
        self.texts: list[str] = []  # generated text per content chunk
        self.usage_tokens: list[int | None] = []  # cumulative completion tokens at that chunk
        self.usage: dict | None = None  # the last usage / meta_info seen
        self.meta: bool = False  # counts came from SGLang meta_info
        self.error: tuple[ErrorClass, str] | None = None


def _chunk_text(choice: dict, chat: bool) -> str:
    if not chat:
        return choice.get("text") or ""
    delta = choice.get("delta") or {}
    # reasoning models stream their thinking first: it is generated text all the same
    return delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or ""


def _error_text(obj: Any) -> str:
    err = obj.get("error") if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        return str(err.get("message") or err)[:300]
    return str(err)[:300]


class _Events(NamedTuple):
    """A stream's good events up to ``[DONE]`` (up to the first bad one, if any), as columns."""

    objs: list[Any]  # each event's JSON object
    times: list[int]  # each one's arrival (the read that completed it)
    error: tuple[ErrorClass, str] | None  # the first bad event: not JSON, not an object, or an error
    count: int  # events in the stream
    tail: bytes  # bytes after the last event that never formed one


def _events(reads: list[bytes], times: list[int]) -> _Events:
    """Every event's JSON in one orjson call; the usual stream without splitting it into events first."""
    usual = json_array(reads)
    if usual is not None:
        try:
            objs = orjson.loads(usual[0])
        except orjson.JSONDecodeError:
            objs = None  # the general path finds which event
        if objs is not None and len(objs) == usual[1]:  # else an event held two values ({},{}): general path
            return _good(objs, times, None, None, len(reads), b"")
    events, tail = split_events(reads, times)
    datas = [ev.data for ev in events]
    try:
        datas = datas[: datas.index(b"[DONE]")]
    except ValueError:
        pass
    error = None
    try:
        objs = orjson.loads(b"[" + b",".join(datas) + b"]") if datas else []
        if len(objs) != len(datas):
            raise ValueError("an event held more than one JSON value")
    except ValueError:  # orjson.JSONDecodeError is one
        objs = []
        for i, data in enumerate(datas):  # the good prefix, then the first bad one
            try:
                objs.append(orjson.loads(data))
            except orjson.JSONDecodeError:
                error = (ErrorClass.MALFORMED, f"event {i}: not JSON: {data[:120]!r}")
                break
    kept = events[: len(objs)]
    names = [ev.event for ev in kept]
    return _good(objs, [ev.t_ns for ev in kept], names if any(names) else None, error, len(events), tail)


def _good(objs: list[Any], times: list[int], names: list[bytes | None] | None,
          error: tuple[ErrorClass, str] | None, count: int, tail: bytes) -> _Events:
    """The events up to the first that is not a JSON object or reports an error (``names``: each event's
    ``event:`` field, None when none had one); that one's error wins over a later one's."""
    for i, obj in enumerate(objs):
        name = names[i] if names else None
        if type(obj) is not dict or name is not None or "error" in obj:
            bad = _bad_event(i, name, obj)
            if bad is not None:
                return _Events(objs[:i], times[:i], bad, count, tail)
    return _Events(objs, times[: len(objs)], error, count, tail)


def _bad_event(i: int, name: bytes | None, obj: Any) -> tuple[ErrorClass, str] | None:
    if type(obj) is not dict:
        return ErrorClass.MALFORMED, f"event {i}: not a JSON object: {orjson.dumps(obj)[:120]!r}"
    if name == b"error" or obj.get("error") is not None:
        return ErrorClass.MALFORMED, f"error event {i}: {_error_text(obj)}"
    return None


def _read_openai(ev: _Events, chat: bool) -> _Stream:
    s = _Stream()
    s.error = ev.error
    times, texts, usage_tokens = s.times, s.texts, s.usage_tokens
    for obj, t in zip(ev.objs, ev.times, strict=True):
        usage = obj.get("usage")
        if usage:
            s.usage = usage
        choices = obj.get("choices")
        if choices:
            text = _chunk_text(choices[0], chat)
            if text:
                times.append(t)
                texts.append(text)
                usage_tokens.append(usage.get("completion_tokens") if usage else None)
    return s


def _read_generate(ev: _Events) -> _Stream:
    """SGLang native /generate: ``text`` is cumulative; ``meta_info`` counts tokens."""
    s = _Stream()
    s.meta = True
    s.error = ev.error
    prev = ""
    for obj, t in zip(ev.objs, ev.times, strict=True):
        meta = obj.get("meta_info") or {}
        if meta:
            s.usage = meta
        text = obj.get("text") or ""
        # cumulative by default; --incremental-streaming-output servers send deltas instead
        if text.startswith(prev):
            delta, prev = text[len(prev) :], text
        else:
            delta, prev = text, prev + text
        if delta:
            s.times.append(t)
            s.texts.append(delta)
            s.usage_tokens.append(meta.get("completion_tokens"))
    return s


def _growth(cumulative: list[int | None], total: int | None) -> list[int] | None:
    """Per-chunk tokens from a cumulative count at each chunk; tokens with no text go to the next chunk."""
    if not cumulative or any(c is None for c in cumulative):
        return None
    out, prev = [], 0
    for c in cumulative:
        if c < prev:  # type: ignore[operator]
            return None
        out.append(c - prev)  # type: ignore[operator]
        prev = c  # type: ignore[assignment]
    if total is not None and total > prev:  # tokens after the last text chunk (e.g. a stop token)
        out[-1] += total - prev
    return out


def apportion(total: int, n: int) -> list[int]:
    """``total`` tokens spread over ``n`` chunks as evenly as integers allow (sums exactly)."""
    base, extra = divmod(total, n)
    return [base + 1 if i < extra else base for i in range(n)]


def decode_stream(
    endpoint: str,
    reads: list[bytes],
    times: list[int],
    rec: RequestRecord,
    t_send_ns: int,
    count: Callable[[str], int] | None = None,
) -> str:
    """Fill timings, token counts, usage and (if the stream was bad) the error of ``rec`` from the
    stream's socket reads and their arrival times; return the generated text (a session's next turn
    carries it in its history)."""
    ev = _events(reads, times)
    s = _read_generate(ev) if endpoint == "generate" else _read_openai(ev, endpoint == "chat")
    usage = s.usage or {}
    completion = usage.get("completion_tokens")
    rec.prompt_tokens = usage.get("prompt_tokens", rec.prompt_tokens)
    rec.completion_tokens = completion if completion is not None else rec.completion_tokens
    if s.meta:
        rec.cached_tokens = usage.get("cached_tokens", rec.cached_tokens)
    else:
        details = usage.get("prompt_tokens_details") or {}
        rec.cached_tokens = details.get("cached_tokens", rec.cached_tokens)

    n = len(s.times)
    if n:
        rec.ttft_ms = (s.times[0] - t_send_ns) / 1e6
        rec.chunk_offsets_ms = [(t - t_send_ns) / 1e6 for t in s.times]
        tokens = _growth(s.usage_tokens, completion)
        if tokens is not None:
            source = TokenCountSource.META_INFO if s.meta else TokenCountSource.USAGE_PER_CHUNK
        elif count is not None:
            tokens, source = [count(t) for t in s.texts], TokenCountSource.TOKENIZER
        elif completion is not None:
            tokens, source = apportion(completion, n), TokenCountSource.APPORTIONED
        else:
            tokens, source = [1] * n, TokenCountSource.CHUNKS
        rec.chunk_tokens = tokens
        rec.token_count_source = source.value
        if count is not None:
            rec.client_completion_tokens = count("".join(s.texts))
    if rec.error_class is None:
        if s.error is not None:
            rec.error_class, rec.error_message = s.error[0].value, s.error[1]
        elif not n and ev.tail:
            rec.error_class = ErrorClass.MALFORMED.value
            rec.error_message = f"not an SSE stream: {ev.tail[:120]!r}"
        elif not n:
            rec.error_class = ErrorClass.EMPTY.value
            rec.error_message = f"stream ended without generated text ({ev.count} events)"
    return "".join(s.texts)
