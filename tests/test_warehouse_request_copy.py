"""The column-wise binary COPY encoder against a real Postgres: every value comes back as it went in."""

from __future__ import annotations

import hashlib
import math
import random
import threading

import pytest
from sqlalchemy import text

from servetune.ingest import load_result
from servetune.records import RequestRecord
from servetune.result import TrialResult
from servetune.warehouse.loader import LoadError
from servetune.warehouse.request_copy import copy_stream
from servetune.warehouse.tables import REQUEST_COLUMNS


def _awkward_records() -> list[RequestRecord]:
    """NULLs, empty and NULL arrays, non-ASCII text, int4 limits, ints in float columns, +-inf."""
    rng = random.Random(7)
    recs = [
        RequestRecord(request_id=0, t_send_s=0.5, queue_ms=1.25, ttft_ms=40.0, e2e_ms=400.0,
                      chunk_offsets_ms=[40.0, 41.5], chunk_tokens=[1, 9], token_count_source="meta_info",
                      prompt_tokens=100, completion_tokens=10, cached_tokens=0, http_status=200, warmup=True),
        RequestRecord(request_id=1, ttft_ms=None, e2e_ms=None, chunk_offsets_ms=[], chunk_tokens=[],
                      error_class="timeout", error_message="read timed out \u2014 \u00fcn\u00efc\u00f8de \u2713",
                      http_status=None, prompt_tokens=None, token_count_source=None),
        RequestRecord(request_id=2, ttft_ms=30.0, e2e_ms=90.0, completion_tokens=None,
                      chunk_offsets_ms=[30.0, 60.0, 90.0], chunk_tokens=[3, 4, 5], prefix_group=-1, turn=3,
                      n_images=2),  # tpot from the chunk sum
        RequestRecord(request_id=3, ttft_ms=10.0, e2e_ms=20.0, completion_tokens=1,  # tpot NULL: 1 token
                      chunk_offsets_ms=None, chunk_tokens=None),  # type: ignore[arg-type]  # NULL arrays
        RequestRecord(request_id=2**31 - 1, prompt_tokens=2**31 - 1, prefix_group=-(2**31), t_send_s=1e300,
                      queue_ms=-0.0, ttft_ms=math.inf, e2e_ms=-math.inf, chunk_tokens=[2**31 - 1, -(2**31)],
                      chunk_offsets_ms=[5e-324, -1.5]),
        RequestRecord(request_id=5, queue_ms=0, ttft_ms=12, e2e_ms=20, completion_tokens=5,  # ints in float columns
                      chunk_offsets_ms=[1, 2], chunk_tokens=[2, 3], error_message="", client_completion_tokens=4),
    ]
    for i in range(6, 300):  # varied lengths, so rows and batches differ in shape
        k = rng.randint(0, 40)
        recs.append(RequestRecord(
            request_id=i, t_send_s=i / 7, queue_ms=rng.random(), ttft_ms=rng.uniform(5, 50),
            e2e_ms=rng.uniform(60, 900), chunk_offsets_ms=[rng.uniform(0, 900) for _ in range(k)],
            chunk_tokens=[rng.randint(0, 9) for _ in range(k)], completion_tokens=rng.choice([None, k, 2 * k]),
            cached_tokens=rng.choice([None, 0, 17]), token_count_source=rng.choice(["meta_info", "chunks", None]),
            error_class=rng.choice([None, None, "http_5xx"]),
            error_message=rng.choice([None, "x" * rng.randint(0, 90)]),
            http_status=rng.choice([200, 503, None]), warmup=i % 11 == 0))
    return recs


def _expected(trial_id: str, r: RequestRecord) -> dict:
    row = {c: getattr(r, c, None) for c in REQUEST_COLUMNS}
    row.update(trial_id=trial_id, tpot_ms=r.tpot_ms())
    return row


def test_every_value_round_trips(wh):
    trial = TrialResult(trial_id="copy-1", target={"model": "m"}, records=_awkward_records())
    report = load_result(wh, trial, validate=False)
    assert report.ok and report.trials[0].rows["request_records"] == len(trial.records)
    with wh.connect() as conn:
        got = {r["request_id"]: dict(r) for r in conn.execute(text(
            f"SELECT {', '.join(REQUEST_COLUMNS)} FROM request_records WHERE trial_id = 'copy-1'")).mappings()}
    assert len(got) == len(trial.records)
    for r in trial.records:
        want, row = _expected("copy-1", r), got[r.request_id]
        for c in REQUEST_COLUMNS:
            assert row[c] == (pytest.approx(want[c]) if c == "tpot_ms" and want[c] is not None else want[c]), \
                (r.request_id, c, row[c], want[c])
            if isinstance(want[c], float):
                assert math.copysign(1, row[c]) == math.copysign(1, want[c]), (r.request_id, c)  # -0.0 kept


def test_batching_does_not_change_the_bytes_or_the_hash():
    records = _awkward_records()
    streams = {}
    for rows in (7, 64, 10_000):
        h = hashlib.sha256()
        streams[rows] = (b"".join(copy_stream("t", records, h, background=rows == 64, batch_rows=rows)), h.hexdigest())
    assert streams[7] == streams[64] == streams[10_000]
    assert streams[7][1] == hashlib.sha256(streams[7][0]).hexdigest()


@pytest.mark.parametrize(("field", "value", "message"), [
    ("ttft_ms", "12.5", "request 4: ttft_ms must be a number, got '12.5'"),
    ("prompt_tokens", 3.5, "request 4: prompt_tokens must be an integer"),
    ("completion_tokens", 2**31, "request 4: completion_tokens must be an integer that fits int4"),
    ("error_message", 5, "request 4: error_message must be text"),
    ("chunk_tokens", [1, 2.5], "request 4: chunk_tokens must hold int4 integers only"),
    ("chunk_offsets_ms", [1.0, None], "request 4: chunk_offsets_ms must hold numbers only"),
])
def test_bad_values_are_refused_by_name_and_leave_nothing(wh, field, value, message):
    trial = TrialResult(trial_id=f"copy-bad-{field}", target={"model": "m"},
                        records=[RequestRecord(request_id=i, chunk_offsets_ms=[1.0], chunk_tokens=[1])
                                 for i in range(9)])
    setattr(trial.records[4], field, value)
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(LoadError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_result(wh, trial, validate=False)
    with wh.connect() as conn:
        left = conn.execute(text("SELECT (SELECT count(*) FROM trials WHERE trial_id = :t) + "
                                 "(SELECT count(*) FROM request_records WHERE trial_id = :t)"), {"t": trial.trial_id})
        assert left.scalar() == 0
    assert not {t.name for t in threading.enumerate()} - before  # the encoder thread is gone


def test_a_list_in_a_scalar_field_is_refused_by_name():
    records = [RequestRecord(request_id=i) for i in range(4)]
    records[2].ttft_ms = [1.0, 2.0]  # type: ignore[assignment]
    with pytest.raises(ValueError, match=r"request 2: ttft_ms must be a number, got \[1.0, 2.0\]"):
        list(copy_stream("t", records, background=False))
