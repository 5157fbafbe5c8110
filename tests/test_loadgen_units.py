"""Pure parts of the load generator: config validation, SSE splitting, token apportioning, schedules."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from pydantic import ValidationError

from servetune.loadgen import LoadConfig, Target
from servetune.loadgen.endpoints import apportion, decode_stream, request_body
from servetune.loadgen.sse import split_events
from servetune.loadgen.strategies import arrival_offsets_s
from servetune.records import RequestRecord
from servetune.workload.request import WorkloadRequest


def _field_of(exc: ValidationError) -> set[str]:
    return {str(e["loc"][0]) for e in exc.errors()}


@pytest.mark.parametrize("bad", [0, -3])
def test_concurrency_must_be_positive(bad: int) -> None:
    with pytest.raises(ValidationError) as ei:
        LoadConfig(concurrency=bad)
    assert _field_of(ei.value) == {"concurrency"}


def test_rate_mode_requires_rate() -> None:
    with pytest.raises(ValidationError) as ei:
        LoadConfig(mode="rate", concurrency=8)
    assert _field_of(ei.value) == {"rate"}
    with pytest.raises(ValidationError) as ei:
        LoadConfig(mode="rate", concurrency=8, rate=-1)
    assert _field_of(ei.value) == {"rate"}
    assert LoadConfig(mode="rate", concurrency=8, rate=2.5).rate == 2.5


def test_unknown_fields_and_bad_urls_are_rejected() -> None:
    with pytest.raises(ValidationError) as ei:
        LoadConfig(concurrency=1, concurency=2)
    assert _field_of(ei.value) == {"concurency"}
    with pytest.raises(ValidationError) as ei:
        Target(url="localhost:30000")
    assert _field_of(ei.value) == {"url"}
    with pytest.raises(ValidationError) as ei:
        Target(url="http://x", endpoint="embeddings")
    assert _field_of(ei.value) == {"endpoint"}


def test_split_events_across_reads_crlf_and_comments() -> None:
    reads = [b"data: {\"a\":", b" 1}\n\ndata: x\n", b"\n: keep-alive\n\nevent: error\r\ndata: {}\r", b"\n\r\n"]
    times = [10, 20, 30, 40]
    events, tail = split_events(reads, times)
    assert [(e.t_ns, e.event, e.data) for e in events] == [
        (20, None, b'{"a": 1}'),  # completed by the second read
        (30, None, b"x"),
        (40, b"error", b"{}"),
    ]
    assert tail == b""


def test_split_events_unterminated_last_event_and_garbage() -> None:
    events, tail = split_events([b"data: [DONE]"], [5])
    assert [(e.t_ns, e.data) for e in events] == [(5, b"[DONE]")]
    events, tail = split_events([b'{"not": "sse"}'], [5])
    assert events == [] and tail == b'{"not": "sse"}'


@pytest.mark.parametrize("total,n", [(10, 3), (7, 7), (3, 5), (128, 128), (0, 2)])
def test_apportion_sums_exactly_and_evenly(total: int, n: int) -> None:
    parts = apportion(total, n)
    assert sum(parts) == total and len(parts) == n
    assert max(parts) - min(parts) <= 1


def test_chat_body_has_streaming_usage_model_and_merged_extra_body() -> None:
    req = WorkloadRequest(index=0, system="sys", user="hi", input_tokens=3, output_tokens=7, images=["data:x"])
    t = Target(
        url="http://h:1",
        model="m",
        extra_body={"temperature": 0.5, "stream_options": {"continuous_usage_stats": True}, "top_k": 4},
    )
    body = orjson.loads(request_body(t, req))
    assert body["stream"] is True and body["max_tokens"] == 7 and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["model"] == "m" and body["temperature"] == 0.5 and body["top_k"] == 4
    assert body["messages"][1]["content"][0] == {"type": "image_url", "image_url": {"url": "data:x"}}


def test_generate_body_is_sglang_native() -> None:
    req = WorkloadRequest(index=0, system="sys", user="hi", input_tokens=3, output_tokens=7, images=["data:x"])
    t = Target(url="http://h:1", endpoint="generate", model="ignored", extra_body={"sampling_params": {"top_p": 0.9}})
    body = orjson.loads(request_body(t, req))
    assert body["text"] == "sys\nhi" and body["stream"] is True and body["image_data"] == ["data:x"]
    assert body["sampling_params"] == {"max_new_tokens": 7, "temperature": 0.0, "ignore_eos": True, "top_p": 0.9}
    assert "model" not in body


def test_generate_incremental_text_is_also_understood() -> None:
    """Servers started with --incremental-streaming-output send deltas, not cumulative text."""
    from servetune.loadgen.sse import SseEvent

    ev = [
        SseEvent(2_000_000, None, b'{"text": "ab", "meta_info": {"completion_tokens": 1}}'),
        SseEvent(3_000_000, None, b'{"text": "cd", "meta_info": {"completion_tokens": 2}}'),
    ]
    rec = RequestRecord(request_id=0)
    decode_stream("generate", ev, rec, 0)
    assert rec.chunk_tokens == [1, 1] and rec.chunk_offsets_ms == [2.0, 3.0] and rec.ok


def test_constant_poisson_gamma_schedules() -> None:
    const = arrival_offsets_s(LoadConfig(mode="rate", concurrency=4, rate=20, arrival="constant"), 5)
    assert const == pytest.approx([0, 0.05, 0.10, 0.15, 0.20])
    pois = LoadConfig(mode="rate", concurrency=4, rate=50, arrival="poisson", seed=7)
    a, b = arrival_offsets_s(pois, 4001), arrival_offsets_s(pois, 4001)
    assert a == b  # seeded
    assert 4000 / a[-1] == pytest.approx(50, rel=0.05)
    bursty = arrival_offsets_s(
        LoadConfig(mode="rate", concurrency=4, rate=50, arrival="gamma", burstiness=0.25, seed=7), 4001
    )
    cv = lambda x: np.std(np.diff(x)) / np.mean(np.diff(x))  # noqa: E731
    assert 4000 / bursty[-1] == pytest.approx(50, rel=0.1)
    assert cv(a) == pytest.approx(1.0, abs=0.1) and cv(bursty) > 1.7  # gamma shape k: cv = 1/sqrt(k) = 2
    assert arrival_offsets_s(LoadConfig(concurrency=4), 3) == [0.0, 0.0, 0.0]


def test_split_events_fast_path_stamps_the_completing_read() -> None:
    reads = [b'data: {"a":', b" 1}\n\ndata: x\n", b"\n: keep-alive\n\nevent: error\ndata: {}\n\nda", b"ta: y\n\n"]
    events, tail = split_events(reads, [10, 20, 30, 40])
    assert [(e.t_ns, e.event, e.data) for e in events] == [
        (20, None, b'{"a": 1}'),
        (30, None, b"x"),  # its blank line arrived in the third read
        (30, b"error", b"{}"),
        (40, None, b"y"),
    ]
    assert tail == b""


def test_bad_json_keeps_the_chunks_before_it() -> None:
    from servetune.loadgen.sse import SseEvent

    ev = [
        SseEvent(1_000_000, None, b'{"choices": [{"text": "a"}]}'),
        SseEvent(2_000_000, None, b'{"choices": [{"text": "b"}]}'),
        SseEvent(3_000_000, None, b'{"choices": [{"te'),
    ]
    rec = RequestRecord(request_id=0)
    decode_stream("completions", ev, rec, 0)
    assert rec.chunk_offsets_ms == [1.0, 2.0] and rec.error_class == "malformed_sse"
    assert "event 2: not JSON" in rec.error_message
