"""RequestRecords -> Postgres binary ``COPY`` bytes, a column at a time with numpy.

A trial can hold a million records; per-row Python (psycopg's ``write_row``, tuple building) costs
microseconds a row, as much as the server's own ingest. Here each field is read once per batch from
the records, checked and converted as a numpy array, and laid into the binary COPY tuple format
(PostgreSQL docs, "COPY ... Binary Format") with vectorised scatters; the only per-row step left is
joining each row's head (trial id, bool, text) with its tail (numbers and the two chunk arrays).
The bytes made are both what goes on the wire and what the loader's content hash covers, so they
are made once; Postgres' own ``COPY ... TO STDOUT (FORMAT BINARY)`` of the loaded rows gives back the
same bytes (bench/warehouse_load.py checks it).
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np

from servetune.records import RequestRecord

SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # magic, flags, header-extension length
TRAILER = b"\xff\xff"
BATCH_ROWS = 32_768  # ~18 MB of COPY data with 16-chunk records: big enough for numpy, small enough to pipeline
FIRST_BATCH_ROWS = 4_096

# Columns in the order they go on the wire (COPY names them, so any order will do): a head of
# byte-sized parts (trial id, the one-byte bool, text), then a tail in which every part is whole
# 4-byte words (int4/float8 fields: a length word, then 1-2 value words or nothing for NULL; the
# arrays), built as one aligned int32 array. Each row is then one head slice plus one tail slice.
FLOAT_FIELDS = ("t_send_s", "queue_ms", "ttft_ms", "e2e_ms")
INT_FIELDS = ("prompt_tokens", "completion_tokens", "cached_tokens", "client_completion_tokens",
              "requested_input_tokens", "requested_output_tokens", "prefix_group", "n_images", "turn",
              "http_status", "text_before_images", "payload_bytes")
TEXT_FIELDS = ("token_count_source", "error_class", "error_message")
WIRE_COLUMNS: tuple[str, ...] = ("trial_id", "warmup", *TEXT_FIELDS, "request_id", *FLOAT_FIELDS, "tpot_ms",
                                 *INT_FIELDS, "chunk_offsets_ms", "chunk_tokens")

_F8, _I4, _BOOL = np.dtype(">f8"), np.dtype(">i4"), np.dtype("?")
_FLOAT8_OID, _INT4_OID = 701, 23
_INT4_MIN, _INT4_MAX = -(2**31), 2**31 - 1
_ARRAY_ERRORS = (TypeError, ValueError, OverflowError)


class EncodeError(ValueError):
    """A record field that cannot be stored; the message names the request and the field."""


def _bad(records: Sequence[RequestRecord], i: int | None, field: str, want: str) -> EncodeError:
    if i is None:
        return EncodeError(f"{field} must be {want}")
    r = records[i]
    return EncodeError(f"request {r.request_id}: {field} must be {want}, got {getattr(r, field)!r}")


def _first(values: list, ok: Callable[[Any], bool]) -> int | None:
    return next((i for i, v in enumerate(values) if not ok(v)), None)


def _is_int(v: Any) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool) and _INT4_MIN <= v <= _INT4_MAX)


def _is_number(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _scalar_column(records: Sequence[RequestRecord], field: str, values: list,
                   kind: str) -> tuple[np.ndarray, np.ndarray | None]:
    """``values`` as a float64/int64/bool array plus its NULL mask (None when there are no NULLs).

    numpy infers the element type in one C pass; anything but the expected kinds (a string, a float
    in an integer column, an int past int4) is refused by name rather than coerced.
    """
    n = len(values)
    null = None
    try:
        arr = np.array(values)  # one pass; a None anywhere makes it an object array
        if arr.dtype.kind == "O" and None in values:
            null = np.array([v is None for v in values])
            if null.all():
                return np.zeros(n, np.int64), null
            arr = np.array([v for v in values if v is not None])
    except (TypeError, ValueError, OverflowError):  # a list or other odd object among the values
        arr = np.array([], object)
    allowed = {"float": "fiu", "int": "iu", "bool": "b"}[kind]
    if arr.dtype.kind not in allowed or arr.ndim != 1:
        check = {"float": _is_number, "int": _is_int, "bool": lambda v: v is None or isinstance(v, bool)}[kind]
        raise _bad(records, _first(values, check), field,
                   {"float": "a number", "int": "an integer", "bool": "true or false"}[kind])
    if kind == "int" and arr.size and (arr.min() < _INT4_MIN or arr.max() > _INT4_MAX):
        raise _bad(records, _first(values, _is_int), field, "an integer that fits int4")
    if null is not None:
        full = np.zeros(n, arr.dtype)
        full[~null] = arr
        arr = full
    return arr, null


def _scatter(buf: np.ndarray, pos: np.ndarray, slots: np.ndarray) -> None:
    """Write row i's ``slots[i]`` (a fixed number of bytes) at ``buf[pos[i]:]``."""
    buf[pos[:, None] + np.arange(slots.shape[1])] = slots


def _fixed_slots(values: np.ndarray, null: np.ndarray | None, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Each row's field as (int32 length, big-endian value) bytes, and how many of them it really uses.

    A NULL row keeps a full-width slot of which only the length (-1) counts: the next field of the
    row is written over the rest afterwards.
    """
    n = len(values)
    slots = np.empty(n, dtype=[("len", ">i4"), ("value", dtype)])
    slots["len"] = dtype.itemsize
    slots["value"] = values
    sizes = np.full(n, 4 + dtype.itemsize, np.int64)
    if null is not None:
        slots["len"][null] = -1
        sizes[null] = 4
    return slots.view(np.uint8).reshape(n, 4 + dtype.itemsize), sizes


def _text_parts(records: Sequence[RequestRecord], field: str,
                values: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """UTF-8 bytes of a text column, concatenated, with each row's byte length (-1: NULL)."""
    try:
        encoded = [b"" if v is None else v.encode() for v in values]
    except AttributeError:
        raise _bad(records, _first(values, lambda v: v is None or isinstance(v, str)), field, "text") from None
    lens = np.fromiter(map(len, encoded), np.int64, len(encoded))
    if None in values:
        lens[np.array([v is None for v in values])] = -1
    return np.frombuffer(b"".join(encoded), np.uint8), lens, np.maximum(lens, 0)


def _array_units(records: Sequence[RequestRecord], field: str, arrays: list,
                 oid: int) -> tuple[np.ndarray, Callable[[np.ndarray, np.ndarray], None]]:
    """A chunk-array column in Postgres' array wire format (array_recv), counted in 4-byte units.

    Every part of a one-dimensional float8[]/int4[] value is a multiple of 4 bytes (header words,
    then a length word and a 1- or 2-word value per element), so the whole column is built as one
    big-endian int32 array by scatters. Returns each row's size in words and a writer that lays the
    rows out at given word offsets of the tail.
    """
    n = len(arrays)
    null = np.array([a is None for a in arrays]) if None in arrays else None
    try:
        lens = np.fromiter(map(len, arrays), np.int64, n) if null is None else \
            np.array([0 if a is None else len(a) for a in arrays], np.int64)
        total = int(lens.sum())
        present = arrays if null is None else [a for a in arrays if a is not None]
        values = np.fromiter(chain.from_iterable(present), np.float64, total)
    except _ARRAY_ERRORS:
        raise _array_error(records, arrays, field, _is_number, "numbers") from None
    if np.isnan(values).any() and any(None in a for a in arrays if a):  # fromiter reads None as NaN
        raise _array_error(records, arrays, field, _is_number, "numbers")
    words = 2 if oid == _FLOAT8_OID else 1  # value words per element
    if oid == _INT4_OID and total and (not np.array_equal(values, np.floor(values))
                                       or values.min() < _INT4_MIN or values.max() > _INT4_MAX):
        raise _array_error(records, arrays, field, _is_int, "int4 integers")
    units = np.where(lens > 0, 6 + (1 + words) * lens, 4)  # 4 = length word + empty-array header (3)
    if null is not None:
        units[null] = 1

    def write(tail: np.ndarray, at: np.ndarray) -> None:
        full, empty = lens > 0, lens == 0
        if null is not None:
            empty &= ~null
            tail[at[null]] = -1
        tail[at[empty]] = 12
        for k, v in enumerate((0, 0, oid), 1):
            tail[at[empty] + k] = v
        a, m = at[full], lens[full]
        tail[a] = 20 + 4 * (1 + words) * m
        for k, v in enumerate((1, 0, oid), 1):  # ndim, has-NULLs flag, element type
            tail[a + k] = v
        tail[a + 4] = m
        tail[a + 5] = 1  # lower bound
        if total:
            starts = np.cumsum(m) - m
            base = np.repeat(a + 6 - (1 + words) * starts, m) + (1 + words) * np.arange(total)
            tail[base] = 4 * words
            if words == 2:
                halves = values.astype(_F8).view(_I4).reshape(-1, 2)
                tail[base + 1] = halves[:, 0]
                tail[base + 2] = halves[:, 1]
            else:
                tail[base + 1] = values
    return units, write


def _array_error(records: Sequence[RequestRecord], arrays: list, field: str, ok: Callable[[Any], bool],
                 want: str) -> EncodeError:
    bad = next((i for i, a in enumerate(arrays) if a is not None and (
        not isinstance(a, (list, tuple)) or not all(v is not None and ok(v) for v in a))), None)
    where = "" if bad is None else f"request {records[bad].request_id}: "
    return EncodeError(f"{where}{field} must hold {want} only")


def _tpot(ttft: np.ndarray, e2e: np.ndarray, out: np.ndarray,
          nulls: list[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
    """``RequestRecord.tpot_ms`` for a whole column: (E2E - TTFT) / (output tokens - 1)."""
    null = out < 2
    for m in nulls:
        if m is not None:
            null |= m
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = (e2e - ttft) / (out.astype(np.float64) - 1)
    return np.where(null, 0.0, tpot), null


def encode_batch(trial_id: str, records: Sequence[RequestRecord]) -> bytes:
    """Binary COPY tuples (no signature or trailer) for ``records``, columns in ``WIRE_COLUMNS`` order."""
    n = len(records)
    if not n:
        return b""
    col = {f: list(map(attrgetter(f), records)) for f in
           ("request_id", "warmup", *FLOAT_FIELDS, *INT_FIELDS, *TEXT_FIELDS, "chunk_offsets_ms", "chunk_tokens")}

    warmup, warmup_null = _scalar_column(records, "warmup", col["warmup"], "bool")
    floats = {f: _scalar_column(records, f, col[f], "float") for f in FLOAT_FIELDS}
    ints = {f: _scalar_column(records, f, col[f], "int") for f in ("request_id", *INT_FIELDS)}
    offsets_units, write_offsets = _array_units(records, "chunk_offsets_ms", col["chunk_offsets_ms"], _FLOAT8_OID)
    tokens_units, write_tokens = _array_units(records, "chunk_tokens", col["chunk_tokens"], _INT4_OID)
    # output tokens as RequestRecord.output_tokens: server usage, else the sum of chunk tokens
    completion, completion_null = ints["completion_tokens"]
    out_tokens = completion.astype(np.int64)
    if completion_null is not None:
        chunk_sums = np.array([sum(t) if t else -1 for t in col["chunk_tokens"]], np.int64)
        out_tokens = np.where(completion_null, chunk_sums, out_tokens)
    tpot = _tpot(floats["ttft_ms"][0], floats["e2e_ms"][0], out_tokens, [floats["ttft_ms"][1], floats["e2e_ms"][1]])
    word_fields = [_word_slots(*ints["request_id"], _I4), *(_word_slots(*floats[f], _F8) for f in FLOAT_FIELDS),
                   _word_slots(*tpot, _F8), *(_word_slots(*ints[f], _I4) for f in INT_FIELDS)]
    texts = [_text_parts(records, f, col[f]) for f in TEXT_FIELDS]

    # head, in bytes: field count and trial id (the same every row), warmup, the text columns
    tid = trial_id.encode()
    prefix = np.frombuffer(len(WIRE_COLUMNS).to_bytes(2, "big") + len(tid).to_bytes(4, "big") + tid, np.uint8)
    warmup_slots, warmup_size = _fixed_slots(warmup, warmup_null, _BOOL)
    head_len = len(prefix) + warmup_size + sum(4 + data_len for _, _, data_len in texts)
    head_off = np.zeros(n + 1, np.int64)
    np.cumsum(head_len, out=head_off[1:])
    head = np.empty(int(head_off[-1]) + 8, np.uint8)
    pos = head_off[:-1].copy()
    _scatter(head, pos, np.broadcast_to(prefix, (n, len(prefix))))
    pos += len(prefix)
    _scatter(head, pos, warmup_slots)  # a NULL's unused value byte is overwritten by the next field
    pos += warmup_size
    for data, lens, data_len in texts:
        _scatter(head, pos, lens.astype(_I4).view(np.uint8).reshape(n, 4))
        pos += 4
        if data.size:
            starts = np.cumsum(data_len) - data_len
            head[np.repeat(pos - starts, data_len) + np.arange(data.size)] = data
        pos += data_len

    # tail, in 4-byte words: every int4/float8 field, then the two arrays
    tail_units = sum(units for _, _, units in word_fields) + offsets_units + tokens_units
    tail_off = np.zeros(n + 1, np.int64)
    np.cumsum(tail_units, out=tail_off[1:])
    tail = np.empty(int(tail_off[-1]), _I4)
    at = tail_off[:-1].copy()
    for values, null, units in word_fields:
        _write_word_slot(tail, at, values, null)
        at += units
    write_offsets(tail, at)
    write_tokens(tail, at + offsets_units)

    head_bytes, tail_bytes = head.tobytes(), tail.tobytes()
    hb, tb = head_off.tolist(), (tail_off * 4).tolist()
    heads = map(head_bytes.__getitem__, map(slice, hb, hb[1:]))
    tails = map(tail_bytes.__getitem__, map(slice, tb, tb[1:]))
    return b"".join(chain.from_iterable(zip(heads, tails, strict=True)))


def _word_slots(values: np.ndarray, null: np.ndarray | None,
                dtype: np.dtype) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """An int4/float8 column as big-endian value words (n x 1 or n x 2), its NULLs, each row's words."""
    k = dtype.itemsize // 4
    value_words = values.astype(dtype).view(_I4).reshape(len(values), k)
    units = np.full(len(values), 1 + k, np.int64)
    if null is not None:
        units[null] = 1
    return value_words, null, units


def _write_word_slot(words: np.ndarray, at: np.ndarray, values: np.ndarray, null: np.ndarray | None) -> None:
    """Each row's length word (-1 for NULL) and value words at word offsets ``at``."""
    k = values.shape[1]
    if null is not None:
        words[at] = np.where(null, -1, 4 * k)
        at, values = at[~null], values[~null]
    else:
        words[at] = 4 * k
    for j in range(k):
        words[at + 1 + j] = values[:, j]


def copy_stream(trial_id: str, records: Sequence[RequestRecord], hasher: Any = None, *,
                background: bool = True, batch_rows: int = BATCH_ROWS) -> Iterator[bytes]:
    """The whole binary COPY stream (signature, tuples, trailer) in blocks, fed to ``hasher`` in order.

    With ``background`` the batches are encoded in a worker thread, two ahead of the consumer, so
    encoding overlaps with sending (psycopg releases the GIL while it waits on the socket). The
    bytes, and so the digest, do not depend on how the records are batched.
    """
    hasher = hasher if hasher is not None else hashlib.sha256()
    first = min(batch_rows, FIRST_BATCH_ROWS)  # a small first batch gets the server going sooner
    bounds = [0, *range(first, len(records), batch_rows), len(records)] if records else []

    def block(i: int) -> bytes:
        data = encode_batch(trial_id, records[bounds[i]:bounds[i + 1]])
        hasher.update(data)  # batches run one at a time, in order, so the digest is deterministic
        return data

    hasher.update(SIGNATURE)
    yield SIGNATURE
    yield from _blocks(block, range(len(bounds) - 1), background)
    hasher.update(TRAILER)
    yield TRAILER


def _blocks(block: Callable[[int], bytes], batches: range, background: bool) -> Iterator[bytes]:
    if not background:
        yield from map(block, batches)
        return
    with ThreadPoolExecutor(1, thread_name_prefix="servetune-copy-encode") as pool:
        pending: deque[Future[bytes]] = deque()
        try:
            for i in batches:
                pending.append(pool.submit(block, i))
                if len(pending) > 2:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:  # the consumer stopped early (a failed COPY): drop what is queued
            for f in pending:
                f.cancel()
