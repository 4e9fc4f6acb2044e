"""What report.md (report.py) and report.html (page.py) share: how a figure is written in a table
cell, the mark of a row whose output length differs from NTP's, and the Pareto front's rule.

    >>> _pct(0.975), _x(7.0), _num(3.14159, 2), _interval(0.9, 1.0, _pct)
    ('97.5', '7.00x', '3.14', ' [90.0, 100.0]')
"""
from __future__ import annotations

from .metrics import TOKENS_DIFFER_PERCENT

LENGTH_MARK = "†"
LENGTH_FOOTNOTE = (f"{LENGTH_MARK} mean output length differs from NTP's by more than {TOKENS_DIFFER_PERCENT}% on the "
                   "same examples (see 'tokens vs NTP' in the decoding profile): the NFE speed factor then compares "
                   "forwards spent on different amounts of text, and one that stops early looks faster than it is; "
                   "tokens per forward is the fairer figure there.")
SPEED_TIE = 0.01  # speed factors within 1% of each other count as equal on the Pareto front


def length_mark(row: dict) -> str:
    return f" {LENGTH_MARK}" if row.get("tokens_differ_from_ntp") else ""


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _x(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _num(value, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _interval(lo, hi, fmt) -> str:
    return "" if lo is None else f" [{fmt(lo)}, {fmt(hi)}]"


def sampled_rows(rows: list[dict]) -> bool:
    """Whether some configuration has N > 1 samples per example (then accuracy is pass@1, and pass@k shows)."""
    return any((r.get("samples") or 1) > 1 for r in rows)


def dominates(a: tuple[float, float], b: tuple[float, float], tie: float = SPEED_TIE) -> bool:
    """Point a = (speed, accuracy) beats b: at least as accurate, not slower (speeds within ``tie``,
    relative, are equal), and better on one of the two."""
    not_slower = a[0] * (1 + tie) >= b[0]
    faster = a[0] > b[0] * (1 + tie)
    return a[1] >= b[1] and not_slower and (a[1] > b[1] or faster)


def pareto_front(points: list[tuple[float, float]], tie: float = SPEED_TIE) -> list[tuple[float, float]]:
    """Points no other point dominates, sorted by speed. Speed factors within ``tie`` of each other
    are equal: 1.0008x against NTP's 1.00x (a configuration whose answers are a token shorter) is no
    speed-up that makes a less accurate configuration part of the front."""
    return sorted({p for p in points if not any(dominates(q, p, tie) for q in points)})
