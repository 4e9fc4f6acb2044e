"""Learn then Test (Angelopoulos, Bates, Candès, Jordan, Lei 2021, arXiv 2110.01052): which settings of
a solver have a risk certified at most ``max_loss`` (ε), with probability at least 1 - ``delta`` (δ)
over the draw of the calibration examples. Pure arithmetic (math and numpy), no records.

    >>> p = binomial_p_value(losses=2, n=300, max_loss=0.02)    # P(Bin(300, 0.02) <= 2) = 0.0602
    >>> certified_prefix([0.0, 0.01, 0.06, 0.3, 0.01], delta=0.1)  # tested in this order
    3

Each setting's null hypothesis is "its risk is above ε". With 0/1 losses, one per example, drawn
independently, the loss count of a setting whose risk is r is Bin(n, r), and the p-value of the count
k is P(Bin(n, ε) <= k): the exact binomial tail, valid at every n (no normal approximation, no
Hoeffding slack; the binomial bound is what LTT's paper recommends for 0/1 losses). A setting whose
risk is above ε gets a p-value <= δ with probability at most δ.

Fixed-sequence testing: test the settings one by one in an order fixed before the losses are seen,
each at level δ, and stop at the first p-value above δ; every setting before the stop is certified.
The probability that any certified setting has a risk above ε is at most δ (the first such setting
in the order must itself pass a level-δ test), so any choice among the certified ones (the fastest)
keeps the guarantee. Testing every setting at δ without the order, or certifying on the observed risk
alone, does not: ``tests/test_ltt.py`` shows both failing by simulation, beside the rule holding.
"""
from __future__ import annotations

import math

import numpy as np

from ..types import UsageError


MAX_CALIBRATION = 1e9  # calibration examples: an ε that needs more is refused (no one decodes that many)


def check_levels(max_loss: float, delta: float) -> None:
    """Refuse an ε or δ outside (0, 1) in one line that names the flag."""
    for flag, value, meaning in (("--max-loss", max_loss, "the largest accuracy loss against NTP to certify, "
                                                         "e.g. 0.02 for 2 points"),
                                 ("--delta", delta, "the chance the certificate may be wrong, e.g. 0.1")):
        if not (isinstance(value, (int, float)) and 0 < value < 1):  # also refuses NaN
            raise UsageError(f"{flag} must lie strictly between 0 and 1 (got {value}): {meaning}")
    # an ε so small that no calibration set certifies it (1e-320: the count overflows; 1e-300: a 301-digit one)
    needed = math.log(delta) / math.log1p(-max_loss) if max_loss < 1 else 0.0
    if not needed <= MAX_CALIBRATION:
        least = 10.0 ** math.ceil(math.log10(-math.log(delta) / MAX_CALIBRATION))  # a round ε that is allowed
        count = f"{needed:.3g}" if math.isfinite(needed) else "more than 1e308"
        raise UsageError(f"--max-loss {max_loss} is too small to certify at --delta {delta}: even with no loss at all it "
                         f"needs ln(delta) / ln(1 - max_loss) = {count} calibration examples; give --max-loss "
                         f"{least:g} or more (at most {MAX_CALIBRATION:.0e} examples)")


def min_examples(max_loss: float, delta: float) -> int:
    """The fewest examples that can certify anything at (ε, δ): with no loss at all the p-value is
    (1 - ε)^n, which is <= δ from n = ln δ / ln(1 - ε) on (114 at ε = 0.02, δ = 0.1)."""
    n = math.ceil(math.log(delta) / math.log1p(-max_loss))
    return n + 1 if (1 - max_loss) ** n > delta else n  # the ceiling of a rounded quotient may fall one short


def binomial_cdf(n: int, max_loss: float) -> np.ndarray:
    """[P(Bin(n, ε) <= k) for k = 0..n], from the probabilities in log space (no overflow at large n)."""
    k = np.arange(n + 1)
    log_pmf = (math.lgamma(n + 1) - np.array([math.lgamma(i + 1) + math.lgamma(n - i + 1) for i in k])
               + k * math.log(max_loss) + (n - k) * math.log1p(-max_loss))
    cdf = np.minimum(np.cumsum(np.exp(log_pmf)), 1.0)
    cdf[n] = 1.0  # exactly, whatever the rounding of the sum
    return cdf


def binomial_p_value(losses: int, n: int, max_loss: float) -> float:
    """The exact p-value of "risk > ε" for ``losses`` out of ``n``: P(Bin(n, ε) <= losses)."""
    if not 0 <= losses <= n:
        raise ValueError(f"need 0 <= losses <= n (got losses={losses}, n={n})")
    return float(binomial_cdf(n, max_loss)[losses])


def p_values(losses, n: int, max_loss: float) -> np.ndarray:
    """``binomial_p_value`` of every count in the integer array ``losses`` (any shape), at one n."""
    return binomial_cdf(n, max_loss)[np.asarray(losses)]


def certified_prefix(p: np.ndarray | list, delta: float) -> np.ndarray | int:
    """How many settings fixed-sequence testing certifies: the length of the longest prefix of
    ``p`` (p-values in the testing order, along the last axis) that are all <= δ."""
    passed = np.asarray(p) <= delta
    count = np.cumprod(passed, axis=-1).sum(axis=-1)
    return int(count) if np.ndim(count) == 0 else count


def choose(p: np.ndarray | list, nfe: np.ndarray | list, delta: float) -> np.ndarray | int:
    """The index of the certified setting with the fewest forwards (mean NFE, ``nfe``), the first in
    the order on a tie, or -1 where none is certified; along the last axis, as ``certified_prefix``.
    Any choice among the certified settings keeps the guarantee: they are all covered together."""
    p, nfe = np.asarray(p, dtype=float), np.asarray(nfe, dtype=float)
    count = np.asarray(certified_prefix(p, delta))
    inside = np.arange(p.shape[-1]) < count[..., None]
    best = np.where(inside, nfe, np.inf).argmin(axis=-1)
    chosen = np.where(count > 0, best, -1)
    return int(chosen) if np.ndim(chosen) == 0 else chosen
