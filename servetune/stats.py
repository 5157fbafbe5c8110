"""How noisy a figure is across repeats: mean, CV, a Student-t 95% interval, and a Welch comparison.

Repeats of one trial (same config and level, different workload seeds) are few (3-5), so the
intervals use Student's t, not the normal approximation; two configs differ only when the Welch
interval of the difference of their means excludes zero *and* the difference exceeds the plan's
smallest meaningful change. One value has no spread: its interval is unknown (None), never 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

CONFIDENCE = 0.95


def _st():
    """scipy.stats, imported on first use: 1.5 s of import that every Airflow task paid to parse its DAG file
    (servetune.plan imports this module) before it needed a quantile."""
    from scipy import stats

    return stats


class Spread(BaseModel):
    """One figure over n repeats."""

    model_config = ConfigDict(extra="forbid")

    n: int
    mean: float | None = None
    std: float | None = None  # sample standard deviation (ddof=1); None for n < 2
    cv: float | None = None  # std / mean
    ci95: float | None = None  # half-width of the Student-t 95% interval of the mean
    min: float | None = None
    max: float | None = None
    values: list[float] = []

    @property
    def low(self) -> float | None:
        return None if self.mean is None or self.ci95 is None else self.mean - self.ci95

    @property
    def high(self) -> float | None:
        return None if self.mean is None or self.ci95 is None else self.mean + self.ci95

    def text(self, fmt: str = "{:.2f}") -> str:
        """'5.10 ± 0.12 (n=3, CV 1.2%)', or the lone value with n=1."""
        if self.mean is None:
            return "-"
        if self.ci95 is None:
            return f"{fmt.format(self.mean)} (n={self.n})"
        cv = f", CV {self.cv:.1%}" if self.cv is not None else ""
        return f"{fmt.format(self.mean)} ± {fmt.format(self.ci95)} (n={self.n}{cv})"


def spread(values: Sequence[float | None]) -> Spread:
    """The spread of the known values (None values are left out and not counted)."""
    xs = np.asarray([float(v) for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    n = int(xs.size)
    if n == 0:
        return Spread(n=0)
    mean = float(xs.mean())
    out = Spread(n=n, mean=mean, min=float(xs.min()), max=float(xs.max()), values=[float(x) for x in xs])
    if n >= 2:
        std = float(xs.std(ddof=1))
        out.std = std
        out.cv = std / abs(mean) if mean else None
        out.ci95 = float(_st().t.ppf(0.5 + CONFIDENCE / 2, n - 1) * std / math.sqrt(n))
    return out


def difference_ci95(a: Spread, b: Spread) -> float | None:
    """Half-width of the Welch 95% interval of mean(a) - mean(b); None unless both have n >= 2."""
    if a.std is None or b.std is None or a.n < 2 or b.n < 2:
        return None
    va, vb = a.std**2 / a.n, b.std**2 / b.n
    se = math.sqrt(va + vb)
    if se == 0:
        return 0.0
    dof = (va + vb) ** 2 / ((va**2 / (a.n - 1)) + (vb**2 / (b.n - 1))) if va + vb > 0 else a.n + b.n - 2
    return float(_st().t.ppf(0.5 + CONFIDENCE / 2, dof) * se)


class Comparison(BaseModel):
    """a against b: 'better', 'worse' or 'tie', with the numbers that decided it."""

    model_config = ConfigDict(extra="forbid")

    outcome: str  # better | worse | tie
    difference: float  # mean(a) - mean(b)
    relative: float | None  # difference / mean(b)
    threshold: float  # the smallest difference that counts: max(noise, min_change x mean(b))
    noise: float | None  # the Welch 95% half-width (None: too few repeats to know)
    n: int = 0  # paired comparisons: the seeds both sides were measured on
    undecided: bool = False  # paired: the interval straddles the threshold; another seed could change the answer

    def text(self, unit: str = "req/s") -> str:
        rel = f" ({self.relative:+.1%})" if self.relative is not None else ""
        noise = f"95% CI of the difference ±{self.noise:.2f}" if self.noise is not None else "noise unknown (n=1)"
        seeds = f", paired over {self.n} seed(s)" if self.n else ""
        return f"{self.difference:+.2f} {unit}{rel}; needs > {self.threshold:.2f} {unit} ({noise}{seeds})"


def compare(a: Spread, b: Spread, *, min_change: float) -> Comparison:
    """Does a differ from b beyond the noise and beyond ``min_change`` (relative to b)?"""
    ma, mb = a.mean or 0.0, b.mean or 0.0
    diff = ma - mb
    noise = difference_ci95(a, b)
    threshold = max(noise or 0.0, min_change * abs(mb))
    rel = diff / mb if mb else None
    if mb == 0 and ma > 0:
        outcome = "better"
    elif diff > threshold:
        outcome = "better"
    elif diff < -threshold:
        outcome = "worse"
    else:
        outcome = "tie"
    return Comparison(outcome=outcome, difference=diff, relative=rel, threshold=threshold, noise=noise)


def paired_compare(a: dict[int, float], b: dict[int, float], *, min_change: float,
                   prior: tuple[float, int] | None = None, max_n: int | None = None) -> Comparison:
    """a against b on the seeds both were measured on (common random numbers: the seed's draw cancels).

    The noise is the Student-t 95% half-width of the mean paired difference, its variance pooled with
    ``prior`` (relative standard deviation of paired differences and its degrees of freedom, measured on
    the campaign's other paired repeats); with one seed and no prior it is unknown. ``undecided``: the
    interval reaches across the threshold (``min_change`` x b), or, with the noise unknown, the difference
    lies within one threshold of it, so another seed could turn "better" into "tie" or back; with ``max_n``,
    a difference inside the threshold stops adding seeds when even ``max_n`` of them (the half-width they would
    have, the spread as it is now) could not move the interval off it: a tie now rather than after them."""
    seeds = sorted(set(a) & set(b))
    n = len(seeds)
    base = float(np.mean([b[k] for k in seeds])) if n else 0.0
    diffs = np.asarray([a[k] - b[k] for k in seeds], dtype=np.float64)
    diff = float(diffs.mean()) if n else 0.0
    threshold = min_change * abs(base)
    ss, df = (float(((diffs - diff) ** 2).sum()) / base**2, n - 1) if n >= 2 and base else (0.0, 0)
    if prior is not None:
        ss, df = ss + prior[0] ** 2 * prior[1], df + prior[1]
    noise = reach = None
    if df > 0 and n:
        noise = float(_st().t.ppf(0.5 + CONFIDENCE / 2, df) * math.sqrt(ss / df) * abs(base) / math.sqrt(n))
        if max_n and max_n > n:  # the half-width ``max_n`` seeds would have, were the spread the same
            reach = float(_st().t.ppf(0.5 + CONFIDENCE / 2, df + max_n - n) * math.sqrt(ss / df) * abs(base)
                          / math.sqrt(max_n))
    bound = max(noise or 0.0, threshold)
    if base == 0 and diff > 0:
        outcome = "better"
    else:
        outcome = "better" if diff > bound else "worse" if diff < -bound else "tie"
    band = noise if noise is not None else threshold
    futile = reach is not None and abs(diff) <= threshold  # it looks like a tie, and max_n seeds could not say more
    undecided = n > 0 and band > 0 and any(diff - band < edge < diff + band
                                           and not (futile and abs(diff - edge) < reach)
                                           for edge in (threshold, -threshold))
    return Comparison(outcome=outcome, difference=diff, relative=diff / base if base else None, threshold=threshold,
                      noise=noise, n=n, undecided=undecided)


def quantile_interval(values: Sequence[float] | np.ndarray, q: float = 0.99,
                      confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Distribution-free interval for the ``q`` quantile of what ``values`` were drawn from: the order
    statistics whose ranks bound Binomial(n, q) at ``confidence``. At 250 values the upper end of a p99's is
    the maximum (the p99 rests on 2-3 requests); at 1,000 it is the 4th largest (its bottom the 18th). None
    without values."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = x.size
    if n == 0:
        return None
    tail = (1.0 - confidence) / 2.0
    lo = int(_st().binom.ppf(tail, n, q))  # values below the quantile: at least lo, at most hi (at confidence)
    hi = int(_st().binom.ppf(1.0 - tail, n, q)) + 1
    return float(x[max(lo - 1, 0)]), float(x[min(hi, n) - 1])
