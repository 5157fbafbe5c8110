"""bench/client_overhead.py's runs on the lent H200 host's 16 idle cores, kept as data: the figures
docs/benchmarks.md quotes for the load generator at 256 and 1,024 streams are these files, and these tests
hold them to what the document says of them. The 2026-12-02 runs read each chunk when the event loop got to
it; the 2026-12-03 runs are the client with kernel receive stamps and batched reads (Target.read_batch_ms)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data" / "client-overhead"
RUNS = sorted(DATA.glob("h200-host-2026-12-02-*.json"))
KERNEL_RUNS = sorted(DATA.glob("h200-host-2026-12-03-kernel-stamps-*.json"))


def _rows(path: Path, streams: int) -> list[dict]:
    return [r for r in json.loads(path.read_text()) if r["streams"] == streams]


def _with(streams: int) -> list[Path]:
    return [p for p in RUNS if _rows(p, streams)]


def test_the_runs_are_kept() -> None:
    assert len(_with(1024)) >= 5 and len(_with(256)) >= 5


@pytest.mark.parametrize("path", _with(1024), ids=lambda p: p.stem)
def test_workers_keep_1024_streams_timestamps_within_5ms_where_one_loop_cannot(path: Path) -> None:
    rows = _rows(path, 1024)
    split = [r for r in rows if r["client"].startswith("servetune x")]
    one = [r for r in rows if r["client"] == "servetune"]
    assert split and one
    for r in split:  # 4 or 8 processes: p99 error under 5 ms, TTFT and gap medians on the truth
        assert r["ts_err_p99_ms"] < 5.0, r
        assert abs(r["ttft_p50_ms"] - r["true_ttft_p50_ms"]) < 1.0 and abs(r["gap_p50_ms"] - r["true_gap_p50_ms"]) < 0.1
        assert r["matched_requests"] == 3072
    assert all(r["ts_err_p99_ms"] > 5.0 for r in one)  # why workers: one event loop falls behind
    # the server (4 processes) kept its 5 ms schedule, so the load really was 1,024 streams at 200 chunks/s
    assert all(abs(r["true_gap_p50_ms"] - 5.0) < 0.1 for r in split)


@pytest.mark.parametrize("path", _with(256), ids=lambda p: p.stem)
def test_at_256_streams_one_process_is_on_the_truth(path: Path) -> None:
    rows = [r for r in _rows(path, 256) if r["client"] == "servetune"]
    assert rows
    for r in rows:
        assert abs(r["ttft_p50_ms"] - r["true_ttft_p50_ms"]) < 1.0 and abs(r["gap_p50_ms"] - r["true_gap_p50_ms"]) < 0.1
        assert r["ts_err_p99_ms"] < 1.0


def test_at_256_streams_cpu_per_chunk_against_the_plain_loop_is_what_the_document_says() -> None:
    """Before kernel stamps the target (<= 0.6 of the plain aiohttp loop's CPU per chunk, paired runs) was not
    met: docs/benchmarks.md gives the paired ratios 0.62-0.88 (median 0.75); this keeps the two in step."""
    ratios, user = [], []
    for path in _with(256):
        rows = _rows(path, 256)
        ours = [r for r in rows if r["client"] == "servetune"]
        plain = [r for r in rows if r["client"] == "plain-aiohttp"]
        for a, b in zip(ours, plain, strict=True):
            ratios.append(a["cpu_s_per_1k_chunks"] / b["cpu_s_per_1k_chunks"])
            user.append(a["cpu_s_per_1k_chunks"] * (1 - a["cpu_sys_share"])
                        / (b["cpu_s_per_1k_chunks"] * (1 - b["cpu_sys_share"])))
    ratios.sort()
    assert len(ratios) == 9 and round(ratios[0], 2) == 0.62 and round(ratios[-1], 2) == 0.88
    assert round(ratios[4], 2) == 0.75
    assert max(user) < 0.75 and sorted(user)[4] < 0.6  # user space alone: about half the plain loop's (median 0.54)


def _pairs(rows: list[dict], streams: int, client: str) -> list[tuple[dict, dict]]:
    """``client``'s runs beside the plain loop's, repeat by repeat (the bench interleaves them)."""
    ours = [r for r in rows if r["streams"] == streams and r["client"] == client]
    plain = [r for r in rows if r["streams"] == streams and r["client"] == "plain-aiohttp"]
    return list(zip(ours, plain, strict=True))


def _on_the_truth(r: dict) -> bool:
    return abs(r["ttft_p50_ms"] - r["true_ttft_p50_ms"]) < 1.0 and abs(r["gap_p50_ms"] - r["true_gap_p50_ms"]) < 0.1


# the paired ratios (servetune / plain loop, CPU per 1k chunks) at 256 streams in each kernel-stamps run,
# (min, median, max) as docs/benchmarks.md gives them
KERNEL_RATIOS = {"1": (0.52, 0.53, 0.56), "2": (0.45, 0.66, 0.72), "3": (0.44, 0.51, 0.60)}


def _ratios(rows: list[dict], client: str) -> list[float]:
    return sorted(a["cpu_s_per_1k_chunks"] / b["cpu_s_per_1k_chunks"] for a, b in _pairs(rows, 256, client))


@pytest.mark.parametrize("path", KERNEL_RUNS, ids=lambda p: p.stem)
def test_with_kernel_stamps_256_streams_are_on_the_truth_at_the_cpu_the_document_gives(path: Path) -> None:
    rows = json.loads(path.read_text())
    ratios = _ratios(rows, "servetune")
    median = ratios[len(ratios) // 2]
    assert len(ratios) in (3, 5)
    assert (round(ratios[0], 2), round(median, 2), round(ratios[-1], 2)) == KERNEL_RATIOS[path.stem[-1]]
    for ours, plain in _pairs(rows, 256, "servetune"):
        assert ours["arrival_stamps"] == "kernel" and plain["arrival_stamps"] == "client"
        assert _on_the_truth(ours) and ours["ts_err_p99_ms"] < 0.1, ours
        assert plain["ts_err_p99_ms"] > 5.0  # the same load, stamped when a loop gets to it
    # the same kernel stamps with a pass per wake-up (read_batch_ms 0) cost more: the batching saves CPU
    unbatched = _ratios(rows, "servetune-unbatched")
    assert unbatched[len(unbatched) // 2] > median + 0.15


@pytest.mark.parametrize("path", KERNEL_RUNS, ids=lambda p: p.stem)
def test_with_kernel_stamps_workers_keep_1024_streams_on_the_truth(path: Path) -> None:
    rows = [r for r in json.loads(path.read_text()) if r["streams"] == 1024]
    split = [r for r in rows if r["client"] == "servetune x4 workers"]
    one = [r for r in rows if r["client"] == "servetune"]
    assert len(split) == len(one) >= 3
    for r in split:
        assert r["ts_err_p99_ms"] < 0.1 and _on_the_truth(r) and r["matched_requests"] == 3072, r
        assert abs(r["true_gap_p50_ms"] - 5.0) < 0.1  # the servers kept their schedule
    # one process: the loop is late by up to 100 ms, so chunks pile up and share a read's stamp
    assert all(r["ts_err_p99_ms"] > 5.0 and r["reads_per_chunk"] < 0.95 for r in one)


def test_over_the_three_kernel_stamps_runs_most_pairs_meet_the_cpu_target() -> None:
    """docs/benchmarks.md: 10 of the 13 pairs <= 0.6, pooled median 0.54 (9 of 12, median 0.53, without the pair
    whose CPU sampler stopped early); run 3 pinned server and client apart."""
    pooled = sorted(r for path in KERNEL_RUNS for r in _ratios(json.loads(path.read_text()), "servetune"))
    assert len(pooled) == 13 and sum(r <= 0.6 for r in pooled) == 10 and round(pooled[6], 2) == 0.54
    clean = sorted(a["cpu_s_per_1k_chunks"] / b["cpu_s_per_1k_chunks"] for path in KERNEL_RUNS
                   for a, b in _pairs(json.loads(path.read_text()), 256, "servetune")
                   if not (a.get("sampler_stopped_early") or b.get("sampler_stopped_early")))
    assert len(clean) == 12 and sum(r <= 0.6 for r in clean) == 9 and round((clean[5] + clean[6]) / 2, 2) == 0.53
    pinned = [r["pinned"] for r in json.loads(KERNEL_RUNS[-1].read_text())]
    assert all(p and p.startswith("server CPUs [0") for p in pinned)
