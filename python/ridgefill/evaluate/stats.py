"""Interval estimates of the evaluation's figures (paper, "Evaluation"): a ratio-of-sums mean with a percentile
bootstrap over documents (:func:`bootstrap_ci`, for ΔNLL) and the Wilson score interval of a proportion
(:func:`wilson_interval`, for needle and RULER scores).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import InputError



@dataclass
class Estimate:
    """A ratio-of-sums mean with its percentile bootstrap interval.

    Attributes:
        mean: ``Σ sums / Σ counts`` over documents (e.g. nats/token).
        lo, hi: interval bounds at ``level`` (``nan`` when no resample has a token).
        docs: documents; tokens: ``Σ counts``; level: e.g. ``0.95``; resamples: bootstrap draws.
    """

    mean: float
    lo: float
    hi: float
    docs: int
    tokens: int
    level: float = 0.95
    resamples: int = 0

    def as_dict(self) -> dict:
        return {"mean": self.mean, "ci": [self.lo, self.hi], "level": self.level, "docs": self.docs,
                "tokens": self.tokens, "resamples": self.resamples}


def bootstrap_ci(sums: Sequence[float], counts: Sequence[float], *, resamples: int = 10000,
                 level: float = 0.95, seed: int = 0) -> Estimate:
    """Mean ``Σ sums / Σ counts`` with a percentile bootstrap interval over documents.

    Each resample draws ``D`` documents with replacement (``D = len(sums)``) and recomputes the ratio;
    resamples whose documents hold no token are dropped. Deterministic for a given ``seed``.

    Args:
        sums: per-document sums of the per-token values ``[D]`` (e.g. ``Σ ΔNLL``, nats).
        counts: per-document token counts ``[D]`` (``≥ 0``).
        resamples: bootstrap draws (``≥ 1``); level: coverage in ``(0, 1)``.

    Raises:
        InputError: empty or mismatched inputs, negative or non-finite values, no token at all, or a
            bad ``resamples``/``level``.
    """
    s = np.asarray(sums, dtype=np.float64)
    c = np.asarray(counts, dtype=np.float64)
    if s.ndim != 1 or s.shape != c.shape or s.size == 0:
        raise InputError(f"bootstrap_ci needs two equal-length 1-D sequences with at least one document; got "
                         f"shapes {s.shape} and {c.shape}")
    if not (np.isfinite(s).all() and np.isfinite(c).all()) or (c < 0).any():
        raise InputError("bootstrap_ci: sums must be finite and counts finite and ≥ 0")
    if c.sum() <= 0:
        raise InputError("bootstrap_ci: no token to average (every count is 0); lower τ or add documents")
    if resamples < 1 or not 0 < level < 1:
        raise InputError(f"bootstrap_ci: resamples must be ≥ 1 and level in (0, 1); got {resamples}, {level}")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, s.size, size=(resamples, s.size))
    cs = c[idx].sum(1)
    ok = cs > 0
    ratios = s[idx].sum(1)[ok] / cs[ok]
    alpha = (1 - level) / 2
    lo, hi = (np.quantile(ratios, [alpha, 1 - alpha]) if ratios.size else (math.nan, math.nan))
    return Estimate(float(s.sum() / c.sum()), float(lo), float(hi), int(s.size), int(c.sum()), level,
                    int(resamples))


def wilson_interval(successes: int, trials: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion, in percent ``[0, 100]`` (for needle scores, where a
    bootstrap of all-correct trials would give a zero-width interval).

    Raises:
        InputError: ``trials < 1`` or ``successes`` outside ``0..trials``.
    """
    if trials < 1 or not 0 <= successes <= trials:
        raise InputError(f"wilson_interval needs 0 ≤ successes ≤ trials and trials ≥ 1; got {successes}/{trials}")
    from statistics import NormalDist

    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    p = successes / trials
    den = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / den
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / den
    return 100 * max(0.0, centre - half), 100 * min(1.0, centre + half)


