"""Warehouse load throughput: ``servetune.warehouse.load_result`` against a raw ``COPY FROM STDIN``.

Both load the same request rows into the same table (same indexes, same transaction shape):
- raw: the rows, dumped beforehand with ``COPY ... TO STDOUT``, streamed back with ``COPY ... FROM
  STDIN`` -- the server's ingest speed with no Python in the way -- in binary (the loader's own
  format: the strict baseline; the bench checks the dump is byte for byte what the loader sends)
  and in text (what ``psql \\copy`` sends);
- loader: ``load_trial(engine, TrialResult, ...)`` end to end: rows encoded from RequestRecords,
  content hash, trial row, binary COPY of records and samples, commit (validation off: the
  checklist is not part of row throughput).
Modes are interleaved and each reports the median of ``--repeat`` runs; the load average is
printed because the figures move with whatever else the machine runs. Target: loader >= 70% of
raw binary. Usage:

    .venv/bin/python bench/warehouse_load.py --rows 1000000 [--database-url URL] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

from sqlalchemy import text

from servetune import localdb
from servetune.records import RequestRecord
from servetune.result import TrialResult, TrialSummary
from servetune.warehouse import db, migrate
from servetune.warehouse.loader import ExperimentInfo, load_trial
from servetune.warehouse.request_copy import WIRE_COLUMNS, copy_stream


def make_result(n: int, chunks: int, seed: int = 0) -> TrialResult:
    rng = random.Random(seed)
    records = []
    for i in range(n):
        ttft = rng.uniform(30, 400)
        step = rng.uniform(8, 40)
        records.append(RequestRecord(
            request_id=i, t_send_s=i * 0.001, queue_ms=rng.uniform(0, 3), ttft_ms=ttft,
            e2e_ms=ttft + step * chunks, chunk_offsets_ms=[ttft + k * step for k in range(chunks)],
            chunk_tokens=[8] * chunks, token_count_source="meta_info", prompt_tokens=rng.randint(200, 4000),
            completion_tokens=8 * chunks, cached_tokens=rng.randint(0, 200), requested_input_tokens=1000,
            requested_output_tokens=8 * chunks, prefix_group=rng.randint(-1, 7), warmup=i < 16,
            http_status=200,
        ))
    return TrialResult(trial_id=f"bench-load-{n}", target={"model": "bench-model", "engine": "sim"},
                       load={"mode": "concurrency", "concurrency": 64}, records=records,
                       summary=TrialSummary(requests_total=n))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--chunks", type=int, default=16, help="content chunks per request (array lengths)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--database-url", default=None,
                    help="an EMPTY database it may truncate (default: a fresh one on the local server)")
    args = ap.parse_args()

    server, cluster = localdb.resolve_server()
    url = args.database_url or localdb.create_database(server)
    try:
        migrate.upgrade(url)
        eng = db.engine(url)
        t = time.perf_counter()
        result = make_result(args.rows, args.chunks)
        print(f"built {args.rows} records ({args.chunks} chunks each) in {time.perf_counter() - t:.1f}s")
        exp = ExperimentInfo.for_lone_trial(result)
        cols = ", ".join(WIRE_COLUMNS)  # the loader's column order, so the binary dumps are its bytes

        def clear() -> None:  # this database is the benchmark's own: start every run from empty tables
            with eng.begin() as conn:
                conn.execute(text("TRUNCATE experiments, trials, request_records, gpu_samples, server_samples, "
                                  "validations"))

        def run_loader() -> float:
            clear()
            t0 = time.perf_counter()
            load_trial(eng, result, exp, lone=True)
            return time.perf_counter() - t0

        # one loader run to produce the exact rows the raw COPY will replay
        run_loader()
        dumps: dict[str, bytearray] = {}
        with eng.connect() as conn:
            cur = conn.connection.driver_connection.cursor()
            for fmt in ("BINARY", "TEXT"):
                dumps[fmt] = bytearray()
                with cur.copy(f"COPY (SELECT {cols} FROM request_records WHERE trial_id = %s) TO STDOUT "
                              f"(FORMAT {fmt})", (result.trial_id,)) as copy:
                    for block in copy:
                        dumps[fmt] += block
        same = dumps["BINARY"] == b"".join(copy_stream(result.trial_id, result.records, background=False))
        print(f"raw payloads: {len(dumps['BINARY']) / 1e6:.0f} MB binary, {len(dumps['TEXT']) / 1e6:.0f} MB text; "
              f"binary dump identical to the loader's COPY bytes: {'yes' if same else 'NO'}")
        if not same:
            raise SystemExit("the raw binary baseline would not send what the loader sends")

        def run_raw(fmt: str) -> float:
            clear()
            with eng.begin() as conn:  # the same trial row the loader writes first, so the FK holds
                conn.execute(text("INSERT INTO experiments (experiment_id, model, trigger) VALUES (:e, 'm', 'bench')"),
                             {"e": exp.experiment_id})
                conn.execute(text("INSERT INTO trials (trial_id, experiment_id, status, measured_status, "
                                  "content_sha256) VALUES (:t, :e, 'ok', 'ok', 'x')"),
                             {"t": result.trial_id, "e": exp.experiment_id})
            t0 = time.perf_counter()
            with eng.begin() as conn:
                cur = conn.connection.driver_connection.cursor()
                with cur.copy(f"COPY request_records ({cols}) FROM STDIN (FORMAT {fmt})") as copy:
                    view = memoryview(dumps[fmt])
                    for i in range(0, len(view), 1 << 20):
                        copy.write(view[i:i + (1 << 20)])
            return time.perf_counter() - t0

        load_before = os.getloadavg()
        times: dict[str, list[float]] = {"raw binary COPY": [], "raw text COPY": [], "servetune loader": []}
        for _ in range(args.repeat):  # interleaved, so drift on a shared machine hits all alike
            times["raw binary COPY"].append(run_raw("BINARY"))
            times["raw text COPY"].append(run_raw("TEXT"))
            times["servetune loader"].append(run_loader())
        clear()
        eng.dispose()
        n = args.rows
        med = {k: statistics.median(v) for k, v in times.items()}
        for name, runs in times.items():
            print(f"{name:17s}: {n / med[name]:10,.0f} rows/s  (median of {args.repeat}: {med[name]:.2f}s; "
                  f"runs {', '.join(f'{x:.2f}' for x in runs)})")
        load_after = os.getloadavg()
        print(f"load average (1/5/15 min) before {'/'.join(f'{x:.2f}' for x in load_before)}, "
              f"after {'/'.join(f'{x:.2f}' for x in load_after)} on {os.cpu_count()} CPUs")
        for base in ("raw binary COPY", "raw text COPY"):
            print(f"loader / {base:15s}: {med[base] / med['servetune loader']:.0%}"
                  + ("  (target >= 70%)" if base == "raw binary COPY" else ""))
    finally:
        if not args.database_url:
            localdb.drop_database(server, url.rsplit("/", 1)[1])
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    main()
