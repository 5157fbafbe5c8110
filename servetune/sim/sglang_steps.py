"""Step times of a real SGLang server, read back from its own scheduler log kept with each trial.

A measured trial (``servetune bench``/``tune`` against SGLang with its log captured) holds
``server.scheduler_log``: SGLang's "Prefill batch" / "Decode batch" lines parsed by
servetune.telemetry.scheduler_log. Two kinds of line carry a duration, and this module turns them
into the step-time rows bench/calibrate_sim.py fits a GPU profile to:

* **decode**: ``gen throughput`` is the tokens generated since the previous decode line over the
  wall time since it (one line per ``--decode-log-interval`` steps, 40). Kept only when nothing else
  ran in between: the previous batch line is a decode line with the same ``#running-req`` b and
  ``#token`` grew by exactly interval x b (no prefill, no request finished). Then one step of b
  sequences took ``1000 * b / throughput`` ms.
* **prefill**: in SGLang 0.5.17 a prefill line's ``input throughput`` is its ``#new-token`` over
  the time since the previous prefill line. Kept only inside a burst (the previous batch line is a
  prefill that left requests waiting or a chunk pending), where that time is this batch's forward.

``#token`` counts the KV pool's tokens in use, a shared prefix once; the simulator prices attention
per sequence (each reads its own prefix), so the decode context adds back the prefix copies
estimated from the trial's cached tokens per request. Pure functions over trial dicts; nothing is
fitted here.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import orjson

from servetune.experiment import ResultFolder

DEFAULT_DECODE_LOG_INTERVAL = 40


def _trial_docs(path: Path) -> Iterator[dict[str, Any]]:
    if path.is_dir():
        folder = ResultFolder(path)  # a campaign's trials/, else a folder of trial files
        files = folder.trial_files() if folder.trials_dir.is_dir() else sorted(path.glob("*.json"))
        for f in files:
            yield orjson.loads(f.read_bytes())
    elif path.name.endswith((".tar.xz", ".tar.gz", ".tgz", ".tar")):
        with tarfile.open(path) as tar:
            for m in sorted(tar.getmembers(), key=lambda m: m.name):
                if m.isfile() and m.name.endswith(".json") and "/trials/" in f"/{m.name}":
                    yield orjson.loads(tar.extractfile(m).read())  # type: ignore[union-attr]
    elif path.suffix == ".json":
        yield orjson.loads(path.read_bytes())
    else:
        raise ValueError(f"{path}: expected a campaign directory, a folder of trial files, a .tar.xz of one,"
                         " or a trial .json")


def load_trials(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Every trial file under ``paths`` (campaign dirs, trial folders, archives of them, trial JSONs)."""
    out = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise ValueError(f"{p}: no such file or directory")
        out.extend(d for d in _trial_docs(p) if isinstance(d, dict) and "summary" in d)
    return out


def decode_log_interval(trial: dict[str, Any]) -> int:
    info = (trial.get("server") or {}).get("server_info") or {}
    return int(info.get("decode_log_interval") or DEFAULT_DECODE_LOG_INTERVAL)


def prefix_copies(trial: dict[str, Any]):
    """b -> prefix tokens that b running sequences attend to beyond what ``#token`` counts.

    Estimated from the trial's measured requests: each holds ``cached_len.mean`` tokens of a shared
    prefix on average; at most ``num_prefixes`` distinct prefixes of ``cached_len.p90`` tokens are
    resident once.
    """
    cached = (trial.get("summary") or {}).get("cached_len") or {}
    mean, length = float(cached.get("mean") or 0.0), float(cached.get("p90") or 0.0)
    spec = ((trial.get("workload") or {}).get("spec") or {}).get("shared_prefix") or {}
    distinct = int(spec.get("num_prefixes") or 1)
    return lambda b: max(0.0, b * mean - min(b, distinct) * length)


def step_rows(trial: dict[str, Any]) -> list[dict[str, Any]]:
    """The trial's clean decode and prefill steps as rows (phase, batch, context, cached, ms, trial, level).

    decode: batch = #running-req, context = KV tokens per sequence (interval mean, prefix copies
    added back), cached = 0. prefill: batch = #new-seq, context = new tokens per sequence, cached =
    prefix-cache hits per sequence.
    """
    log = (trial.get("server") or {}).get("scheduler_log") or {}
    rows = log.get("rows") or []
    interval = decode_log_interval(trial)
    copies = prefix_copies(trial)
    tag = {"trial": str(trial.get("trial_id", ""))[:8], "level": (trial.get("load") or {}).get("concurrency")}
    out = []
    for prev, r in pairwise(rows):
        rate = r.get("throughput") or 0.0
        if rate <= 0 or prev.get("kind") != r.get("kind"):
            continue
        if r["kind"] == "decode":
            b = r.get("running_req") or 0
            tok, tok0 = r.get("num_token"), prev.get("num_token")
            if b <= 0 or prev.get("running_req") != b or tok is None or tok0 is None or tok - tok0 != interval * b:
                continue
            ctx = ((tok + tok0) / 2 + copies(b)) / b
            out.append({"phase": "decode", "batch": b, "context": ctx, "cached": 0.0, "ms": 1000.0 * b / rate, **tag})
        else:
            seqs, new = r.get("new_seq") or 0, r.get("new_token") or 0
            if seqs <= 0 or new <= 0 or not ((prev.get("queue_req") or 0) > 0 or (prev.get("pending_token") or 0) > 0):
                continue
            out.append({"phase": "prefill", "batch": seqs, "context": new / seqs,
                        "cached": (r.get("cached_token") or 0) / seqs, "ms": 1000.0 * new / rate, **tag})
    return out
