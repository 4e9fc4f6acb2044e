"""The one table of report columns: each summary-row figure that a table shows, with its one name,
its text, its 95% interval and where it appears. The `run` table on stderr (cli.py), report.md's
detail tables (report.py) and report.html's leaderboard (page.py, its script reads the key, header
and tooltip from the page's data) all read COLUMNS, in its order: a figure is added here, once.

    >>> [c.header for c in COLUMNS if c.report == PROFILE][:3]
    ['tokens (mean)', 'tokens vs NTP', 'nfe (mean)']
    >>> WALL.cell({"speed_factor_wall": 2.0, "speed_factor_wall_lo": 1.5, "speed_factor_wall_hi": 2.5})
    '2.00x [1.50x, 2.50x]'

A new figure first needs its field in ``types.SUMMARY_ROW_FIELDS`` and its definition in
``metrics.summarize`` (docs/measurement.md, 'Adding a figure to the reports').
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .formats import _num, _pct, _x, length_mark
from .metrics import is_lossless

ACCURACY, PROFILE = "Accuracy and speed factors", "Decoding profile"  # report.md's two detail tables
CI = " [95% CI]"  # what a report.md header adds where its cells carry a 95% interval


@dataclass(frozen=True)
class Column:
    key: str  # the summary row's field (types.SUMMARY_ROW_FIELDS)
    header: str  # its name in report.md and on the page
    text: Callable[[Any], str]  # a value's text in report.md and on the page (and of its interval's bounds)
    title: str  # what the figure is: the page's tooltip on the header
    interval: tuple[str, str] | None = None  # the fields of its 95% interval
    report: str | None = None  # the report.md detail table that shows it (ACCURACY, PROFILE); None: the page only
    # the `run` table's (short header, {k}: pass@k's k; width; format spec of the value); None: not there
    run: tuple[str, int, str] | None = None
    run_value: Callable[[dict], Any] | None = None  # the `run` table's value where it is not row[key]
    row_text: Callable[[dict], str] | None = None  # the cell's text where it needs more of the row than its value
    marked: bool = False  # carries LENGTH_MARK where the row's output length differs from NTP's
    sampled_only: bool = False  # shown only where some configuration has several samples per example
    sampled_header: str | None = None  # its name then

    def name(self, sampled: bool = False) -> str:
        return self.sampled_header if sampled and self.sampled_header else self.header

    def value_text(self, row: dict) -> str:
        return self.row_text(row) if self.row_text else self.text(row.get(self.key))

    def interval_text(self, row: dict) -> str:
        """'[lo, hi]' of the row's 95% interval, "" where the column or the row has none."""
        lo, hi = (row.get(k) for k in self.interval) if self.interval else (None, None)
        return "" if lo is None or hi is None else f"[{self.text(lo)}, {self.text(hi)}]"

    def cell(self, row: dict) -> str:
        """report.md's cell: the value, the length mark, the interval."""
        interval = self.interval_text(row)
        return self.value_text(row) + (length_mark(row) if self.marked else "") + (" " + interval if interval else "")

    def run_cell(self, row: dict) -> str:
        value = self.run_value(row) if self.run_value else row.get(self.key)
        return "-" if value is None else format(value, self.run[2])


def _mib(value) -> str:
    return "-" if not value else f"{value / 2**20:.0f}"


def _ntp_percent(row: dict) -> float | None:
    """The `run` table's '= NTP %': a lossless row's (verified or a generate baseline) share of samples whose
    output is NTP's, in percent; None for the others, whose outputs are not meant to be NTP's."""
    return 100 * row["ntp_match_rate"] if is_lossless(row) and row.get("ntp_match_rate") is not None else None


def _pass_at_k(row: dict) -> str:
    return "-" if row.get("pass_at_k") is None else f"pass@{row['pass_k']}: {_pct(row['pass_at_k'])}"


def _digits(n: int) -> Callable[[Any], str]:
    return lambda v: _num(v, n)


# In the order of every output: each shows the columns that name it, in this order (the `run` table's
# columns, report.md's two tables' and the page's are each a subsequence of it).
COLUMNS = [
    Column("n", "n", str, "samples without error", report=ACCURACY, run=("n", 4, "d")),
    Column("errors", "errors", str, "samples whose decoding raised", report=ACCURACY),
    Column("accuracy", "accuracy %", _pct,
           "share of correct samples (pass@1 with several samples per example), 95% interval",
           ("accuracy_lo", "accuracy_hi"), ACCURACY, ("acc", 6, ".3f"), sampled_header="accuracy = pass@1 %"),
    Column("pass_at_k", "pass@k %", _pct, "unbiased pass@k (Chen et al. 2021), 95% interval",
           ("pass_at_k_lo", "pass_at_k_hi"), ACCURACY, ("pass@{k}", 7, ".3f"), row_text=_pass_at_k, sampled_only=True),
    Column("tokens", "tokens (mean)", _digits(1), "mean output tokens per sample", report=PROFILE),
    Column("tokens_vs_ntp", "tokens vs NTP", _x, "mean output length over NTP's on the same examples",
           report=PROFILE, marked=True),
    Column("nfe", "nfe (mean)", _digits(1), "mean forwards per sample", report=PROFILE, run=("nfe", 8, ".1f")),
    Column("tokens_per_forward", "tokens/forward", _digits(2), "total tokens over total forwards", report=PROFILE,
           run=("tok/fwd", 8, ".2f")),
    Column("acceptance_rate", "acceptance %", _pct, "verified: share of drafted tokens NTP confirmed", report=PROFILE,
           run=("accept", 6, ".3f")),
    Column("ntp_match_rate", "= NTP output %", _pct, "share of samples whose output ids equal NTP's", report=ACCURACY,
           run=("= NTP %", 7, ".1f"), run_value=_ntp_percent),
    Column("speed_factor_nfe", "speed factor NFE", _x,
           "mean over examples of NTP's forwards over this configuration's, 95% interval",
           ("speed_factor_nfe_lo", "speed_factor_nfe_hi"), ACCURACY, ("speed_nfe", 9, ".2f"), marked=True),
    Column("speed_factor_wall", "speed factor wall, decode", _x,
           "NTP's total decode time over this configuration's (prefill left out), 95% interval",
           ("speed_factor_wall_lo", "speed_factor_wall_hi"), ACCURACY, ("speed_wall", 10, ".2f")),
    Column("speed_factor_e2e", "speed factor end-to-end", _x, "the same with prefill included, 95% interval",
           ("speed_factor_e2e_lo", "speed_factor_e2e_hi"), ACCURACY),
    Column("forwards_per_block", "forwards/block", _digits(2), "mean forwards per block", report=PROFILE),
    Column("peak_memory_bytes", "peak memory MiB", _mib, "the largest peak over the samples", report=PROFILE),
    Column("aup", "AUP (family)", _digits(1),
           "d3LLM's AUP of this configuration's solver family on the task (docs/measurement.md), 95% interval",
           ("aup_lo", "aup_hi")),
    Column("aup_y_max", "AUP y_max", _digits(1), "the best accuracy % on the task: the AUP's y_max"),
]
BY_KEY = {c.key: c for c in COLUMNS}
WALL = BY_KEY["speed_factor_wall"]  # the measured wall-clock factor beside the predicted ones (report.py)


def shown(sampled: bool) -> list[Column]:
    """The columns of a run: pass@k only where some configuration has several samples per example."""
    return [c for c in COLUMNS if sampled or not c.sampled_only]


def report_columns(table: str, sampled: bool) -> list[Column]:
    """report.md's columns of one detail table (ACCURACY, PROFILE)."""
    return [c for c in shown(sampled) if c.report == table]


def report_header(column: Column, sampled: bool) -> str:
    return column.name(sampled) + (CI if column.interval else "")


def run_columns(rows: list[dict]) -> list[tuple[str, int, Callable[[dict], str]]]:
    """The `run` table's columns after task and config: (header, width, cell of a summary row). With
    several samples per example pass@k shows, named for its k where the run has one."""
    ks = sorted({r["pass_k"] for r in rows if r.get("pass_k")})
    out = []
    for c in COLUMNS:
        if not c.run or (c.sampled_only and not any(r.get(c.key) is not None for r in rows)):
            continue
        header = c.run[0].format(k=ks[0] if len(ks) == 1 else "k")
        width = c.run[1]
        out.append((header, max(width, len(header)), c.run_cell))
    return out
