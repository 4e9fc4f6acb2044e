"""Pearson's chi-square tests for the sampling tests, with p-values from torch (no scipy): goodness of fit
of counts against exact probabilities, and homogeneity of two samples. Cells whose expected count is
below 5 are pooled into one, as the test's approximation asks."""
from __future__ import annotations

from collections import Counter

import torch

MIN_EXPECTED = 5.0


def p_value(statistic: float, df: int) -> float:
    """P(chi2(df) >= statistic): the regularised upper incomplete gamma function Q(df/2, statistic/2)."""
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


def goodness_of_fit(observed: Counter, probs: dict, total: int | None = None) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) of ``observed`` counts against ``probs`` (cell -> probability,
    summing to 1). A cell observed but of probability 0 makes the statistic infinite (p = 0)."""
    total = total if total is not None else sum(observed.values())
    if any(count and probs.get(cell, 0.0) <= 0 for cell, count in observed.items()):
        return float("inf"), 0, 0.0
    cells = sorted(probs, key=lambda c: -probs[c])
    expected = [total * probs[c] for c in cells]
    counts = [observed.get(c, 0) for c in cells]
    big = [i for i, e in enumerate(expected) if e >= MIN_EXPECTED]
    small = [i for i, e in enumerate(expected) if e < MIN_EXPECTED]
    pairs = [(counts[i], expected[i]) for i in big]
    if small:
        pairs.append((sum(counts[i] for i in small), sum(expected[i] for i in small)))
    statistic = sum((o - e) ** 2 / e for o, e in pairs if e > 0)
    df = len(pairs) - 1
    return statistic, df, p_value(statistic, df)


def homogeneity(a: Counter, b: Counter) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) of the 2 x cells contingency table of two samples: do
    they come from one distribution? Cells with a pooled expected count below 5 are pooled."""
    n_a, n_b = sum(a.values()), sum(b.values())
    cells = sorted(set(a) | set(b), key=lambda c: -(a.get(c, 0) + b.get(c, 0)))
    rows, pooled = [], [0, 0]
    for c in cells:
        x, y = a.get(c, 0), b.get(c, 0)
        if (x + y) * min(n_a, n_b) / (n_a + n_b) >= MIN_EXPECTED:
            rows.append((x, y))
        else:
            pooled[0] += x
            pooled[1] += y
    if sum(pooled):
        rows.append(tuple(pooled))
    total = n_a + n_b
    statistic = 0.0
    for x, y in rows:
        column = x + y
        for observed, n in ((x, n_a), (y, n_b)):
            expected = n * column / total
            statistic += (observed - expected) ** 2 / expected
    df = len(rows) - 1
    return statistic, df, p_value(statistic, df)
