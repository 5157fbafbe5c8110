"""Sampling token lengths from the spec's distributions, including real traces.

Bounds are honoured by resampling (never clipping), so no bound carries a spike of mass.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np

from servetune.workload.jsonl import TraceError, jsonl_objects
from servetune.workload.spec import Empirical, Fixed, LengthDist, LogNormal, Mixture, Normal, Uniform

_MAX_ROUNDS = 1000  # resampling rounds before we call the bounds unreachable


@lru_cache(maxsize=32)
def _load_trace_cached(path: str, field: str, mtime_ns: int, size: int) -> tuple[float, ...]:
    values: list[float] = []
    for lineno, obj in jsonl_objects(path):
        if field not in obj:
            raise TraceError(f"{path}, line {lineno}: field {field!r} is missing")
        value = obj[field]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise TraceError(f"{path}, line {lineno}: field {field!r} must be a number, got {value!r}")
        if value <= 0:
            raise TraceError(f"{path}, line {lineno}: field {field!r} must be > 0, got {value!r}")
        values.append(float(value))
    if not values:
        raise TraceError(f"{path}: no records (field {field!r})")
    return tuple(values)


def load_trace(path: str | Path, field: str) -> np.ndarray:
    """Every value of ``field`` in a JSONL trace, validated; cached by path, mtime and size."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise TraceError(f"{path}: trace file not found (field {field!r})") from None
    return np.asarray(_load_trace_cached(str(p), field, st.st_mtime_ns, st.st_size))


class LengthSampler:
    """Draws integer lengths from one distribution; prepared once per batch (traces read once)."""

    def __init__(self, dist: LengthDist, *, what: str = "length"):
        self.dist = dist
        self.what = what
        self._support: np.ndarray | None = None
        self._parts: list[LengthSampler] = []
        self._weights: np.ndarray | None = None
        if isinstance(dist, Mixture):
            self._parts = [LengthSampler(p.dist, what=f"{what} (mixture part {i})") for i, p in enumerate(dist.parts)]
            w = np.asarray([p.weight for p in dist.parts], dtype=np.float64)
            self._weights = w / w.sum()
        if isinstance(dist, Empirical):
            raw = np.rint(load_trace(dist.path, dist.field) * dist.scale).astype(np.int64)
            hi = dist.max if dist.max is not None else np.iinfo(np.int64).max
            support = raw[(raw >= dist.min) & (raw <= hi)]
            if support.size == 0:
                raise TraceError(
                    f"{dist.path}: no value of {dist.field!r} (x{dist.scale}) lies within "
                    f"[{dist.min}, {dist.max}] for {what}"
                )
            self._support = support

    def sample(self, rng: np.random.Generator) -> int:
        d = self.dist
        if isinstance(d, Fixed):
            return d.value
        if isinstance(d, Mixture):
            assert self._weights is not None
            return self._parts[int(rng.choice(len(self._parts), p=self._weights))].sample(rng)
        if isinstance(d, Uniform):
            return int(rng.integers(d.min, d.max, endpoint=True))
        if isinstance(d, Empirical):
            assert self._support is not None
            return int(self._support[rng.integers(0, self._support.size)])
        if isinstance(d, Normal | LogNormal):
            hi = d.max if d.max is not None else math.inf
            for _ in range(_MAX_ROUNDS):
                if isinstance(d, Normal):
                    x = rng.normal(d.mean, d.std)
                else:
                    x = rng.lognormal(math.log(d.median), d.sigma)
                v = round(x)
                if d.min <= v <= hi:
                    return int(v)
            raise ValueError(
                f"{self.what}: {d.kind} {d.model_dump()} puts almost no mass within [{d.min}, {d.max}]"
            )
        raise TypeError(f"{self.what}: unknown distribution {d!r}")
