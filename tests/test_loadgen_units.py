"""Pure parts of the load generator: config validation, SSE splitting, token apportioning, schedules."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from pydantic import ValidationError

from servetune.loadgen import LoadConfig, Target
from servetune.loadgen.endpoints import apportion, decode_stream, request_body
from servetune.loadgen.sse import json_array, split_events
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
    reads = [
        b'data: {"text": "ab", "meta_info": {"completion_tokens": 1}}\n\n',
        b'data: {"text": "cd", "meta_info": {"completion_tokens": 2}}\n\n',
    ]
    rec = RequestRecord(request_id=0)
    decode_stream("generate", reads, [2_000_000, 3_000_000], rec, 0)
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
    reads = [b'data: {"choices": [{"text": "a"}]}\n\n', b'data: {"choices": [{"text": "b"}]}\n\n',
             b'data: {"choices": [{"te\n\n']  # one data line per read: the one-call parse fails, then per event
    assert json_array(reads) is not None
    rec = RequestRecord(request_id=0)
    decode_stream("completions", reads, [1_000_000, 2_000_000, 3_000_000], rec, 0)
    assert rec.chunk_offsets_ms == [1.0, 2.0] and rec.error_class == "malformed_sse"
    assert "event 2: not JSON" in rec.error_message


def _chunk(text: str, usage: bool = False) -> bytes:
    obj = {"choices": [{"index": 0, "text": text}]}
    if usage:
        obj["usage"] = {"prompt_tokens": 3, "completion_tokens": 2}
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def test_one_event_per_read_becomes_one_json_array() -> None:
    """The usual stream skips the split into events; [DONE] ends it and is not data."""
    reads = [_chunk("a"), _chunk("b"), _chunk("", usage=True), b"data: [DONE]\n\n"]
    array, count = json_array(reads)
    assert orjson.loads(array) == [orjson.loads(r[6:]) for r in reads[:3]] and count == 3
    assert json_array(reads[:2]) == (b"[" + reads[0][6:-2] + b"," + reads[1][6:-2] + b"]", 2)


@pytest.mark.parametrize("reads", [
    [b'data: {"choices": [{"text": "a"}]},{"choices": [{"text": "b"}]}\n\n'],  # one read
    [b'data: {"choices": [{"text": "a"}]},{"choices": [{"text": "b"}]}\n\n', b"data: [DONE]\n\n"],
])
def test_an_event_holding_two_json_values_is_malformed_not_two_chunks(reads: list[bytes]) -> None:
    rec = RequestRecord(request_id=0)
    decode_stream("completions", reads, [1_000_000 * (i + 1) for i in range(len(reads))], rec, 0)
    assert rec.error_class == "malformed_sse" and "event 0: not JSON" in rec.error_message
    assert not rec.chunk_offsets_ms


@pytest.mark.parametrize("reads,offsets_ms,error", [
    ([_chunk("a")[:10], _chunk("a")[10:]], [2.0], None),  # an event split over two reads: the second's time
    ([_chunk("a") + _chunk("b"), b": keep-alive\n\n"], [1.0, 1.0], None),  # two events in one read, a comment
    ([b"event: error\ndata: {}\n\n"], [], "malformed_sse"),  # a named event (two lines)
    ([_chunk("a").replace(b"\n\n", b"\r\n\r\n")], [1.0], None),  # CRLF framing
    ([b"data: [DONE]\n\n", _chunk("late")], [], "empty_response"),  # [DONE] first: nothing after it counts
    ([_chunk("a")[:-1]], [1.0], None),  # no blank line after the last event
])
def test_any_other_stream_takes_the_general_path(reads, offsets_ms, error) -> None:
    assert json_array(reads) is None
    rec = RequestRecord(request_id=0)
    decode_stream("completions", reads, [(i + 1) * 1_000_000 for i in range(len(reads))], rec, 0)
    assert rec.chunk_offsets_ms == offsets_ms and rec.error_class == error


def test_both_paths_decode_a_real_stream_alike() -> None:
    """The same bytes, one event per read or all in one read: the same record but for the read times."""
    events = [_chunk("ab"), _chunk("c"), _chunk("", usage=True), b"data: [DONE]\n\n"]
    one_per_read, one_read = RequestRecord(request_id=0), RequestRecord(request_id=1)
    decode_stream("completions", events, [1_000_000, 2_000_000, 3_000_000, 4_000_000], one_per_read, 0)
    assert json_array([b"".join(events)]) is None
    decode_stream("completions", [b"".join(events)], [5_000_000], one_read, 0)
    assert one_per_read.chunk_offsets_ms == [1.0, 2.0] and one_read.chunk_offsets_ms == [5.0, 5.0]
    assert one_per_read.chunk_tokens == one_read.chunk_tokens and one_per_read.completion_tokens == 2
    assert one_per_read.ok and one_read.ok
