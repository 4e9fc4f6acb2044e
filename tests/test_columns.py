"""The one table of report columns (sbd_bench/analysis/columns.py): the `run` table on stderr, report.md's
detail tables and report.html's leaderboard show exactly its columns, in its order, by its names; a figure
added to it once shows in all three; the page's script names no figure itself."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from measure_fixtures import standard_records
from sbd_bench.analysis import columns, page
from sbd_bench.analysis.columns import ACCURACY, COLUMNS, CI, PROFILE, Column, report_header
from sbd_bench.analysis.formats import _pct
from sbd_bench.analysis.metrics import summarize
from sbd_bench.analysis.report import ordered, report_text
from sbd_bench.cli import _print_table
from sbd_bench.types import SUMMARY_ROW_FIELDS

ROOT = Path(__file__).resolve().parent.parent


def sampled(rows: list[dict]) -> list[dict]:
    """The rows as a run with 4 samples per example would hold them (pass@4 and its interval)."""
    return [{**r, "samples": 4, "pass_k": 4, "pass_at_k": 0.5, "pass_at_k_lo": 0.25, "pass_at_k_hi": 0.75} for r in rows]


def run_header(rows: list[dict], capsys) -> str:
    _print_table(rows)
    return capsys.readouterr().err.splitlines()[0]


def report_headers(rows: list[dict]) -> dict[str, list[str]]:
    """report.md's detail tables by title: their headers after task and config."""
    lines = report_text(Path("run"), {"provenance": {}}, rows, {}).splitlines()
    return {title: lines[lines.index(f"### {title}") + 4].strip("| ").split(" | ")[2:] for title in (ACCURACY, PROFILE)}


@pytest.mark.parametrize("several", [False, True], ids=["greedy", "sampled"])
def test_every_output_shows_the_tables_columns_by_its_names(several, capsys):
    rows = ordered(summarize(standard_records()))
    rows = sampled(rows) if several else rows
    shown = [c for c in COLUMNS if several or not c.sampled_only]
    # the run table: the short headers (pass@k named for its k), in the table's order
    runs = [c.run[0].format(k=4) for c in shown if c.run]
    assert run_header(rows, capsys).split()[2:] == " ".join(runs).split()
    # report.md: each detail table its columns, the long names, "[95% CI]" where the cells carry one
    assert report_headers(rows) == {t: [report_header(c, several) for c in shown if c.report == t]
                                    for t in (ACCURACY, PROFILE)}
    # the page: every column, by report.md's name (without the interval's note), each cell report.md's text
    data = page.page_data("x", {"provenance": {}}, [], rows, [])
    assert [(c["key"], c["label"]) for c in data["columns"]] == [(c.key, c.name(several)) for c in shown]
    for c in shown:
        assert all(r["texts"][c.key] + (" " + r["intervals"][c.key] if c.key in r["intervals"] else "")
                   + (" †" if c.marked and rows[i].get("tokens_differ_from_ntp") else "") == c.cell(rows[i])
                   for i, r in enumerate(data["rows"])), c.key
    assert {report_header(c, several).removesuffix(CI) for c in shown if c.report} <= {c["label"] for c in data["columns"]}


def test_every_column_is_a_summary_figure():
    for c in COLUMNS:
        assert {c.key, *(c.interval or ())} <= set(SUMMARY_ROW_FIELDS), c.key
    assert len({c.key for c in COLUMNS}) == len({c.header for c in COLUMNS}) == len(COLUMNS)  # one name, one figure
    assert all(c.report in (None, ACCURACY, PROFILE) for c in COLUMNS)


@pytest.mark.parametrize("table", [ACCURACY, PROFILE])
def test_a_figure_added_once_shows_in_all_three_outputs(table, monkeypatch, capsys):
    """One more entry in COLUMNS, and nothing else: the run table, report.md and the page all show it."""
    new = Column("new_figure", "new figure %", _pct, "a figure made up for this test", ("new_lo", "new_hi"), table,
                 ("newfig", 7, ".3f"))
    after = COLUMNS.index(columns.BY_KEY["tokens_per_forward"])
    monkeypatch.setattr(columns, "COLUMNS", [*COLUMNS[:after + 1], new, *COLUMNS[after + 1:]])
    rows = [{**r, "new_figure": 0.5, "new_lo": 0.25, "new_hi": 0.75} for r in ordered(summarize(standard_records()))]

    _print_table(rows)
    header, *lines = capsys.readouterr().err.splitlines()
    cells = header.split()
    assert cells.index("newfig") == cells.index("tok/fwd") + 1
    assert {line.split()[cells.index("newfig")] for line in lines} == {"0.500"}

    headers = report_headers(rows)[table]
    assert "new figure % [95% CI]" in headers
    text = report_text(Path("run"), {"provenance": {}}, rows, {})
    assert f"| {rows[0]['task']} | {rows[0]['config']} |" in text and " 50.0 [25.0, 75.0] |" in text

    data = page.page_data("x", {"provenance": {}}, [], rows, [])
    keys = [c["key"] for c in data["columns"]]
    assert keys.index("new_figure") == keys.index("tokens_per_forward") + 1
    assert data["columns"][keys.index("new_figure")]["label"] == "new figure %"
    assert {(r["texts"]["new_figure"], r["intervals"]["new_figure"]) for r in data["rows"]} == {("50.0", "[25.0, 75.0]")}
    assert all(r["bounds"]["new_figure"] == [0.25, 0.75] for r in data["rows"])


def test_a_column_named_in_no_output_is_on_the_page_alone(monkeypatch, capsys):
    quiet = dataclasses.replace(columns.BY_KEY["tokens"], key="quiet", header="quiet figure", report=None, run=None)
    monkeypatch.setattr(columns, "COLUMNS", [*COLUMNS, quiet])
    rows = ordered(summarize(standard_records()))
    assert "quiet" not in run_header(rows, capsys)
    assert all("quiet figure" not in h for hs in report_headers(rows).values() for h in hs)
    assert page.page_data("x", {"provenance": {}}, [], rows, [])["columns"][-1]["label"] == "quiet figure"


def test_the_pages_script_names_no_figure_itself():
    """report.js takes every header and tooltip from the page's data (columns.COLUMNS): a name written into
    the script would be a second name, left behind when the table's changes."""
    script = (ROOT / "sbd_bench" / "analysis" / "page_assets" / "report.js").read_text(encoding="utf-8")
    written = [c.header for c in COLUMNS if len(c.header) > 3 and (f'"{c.header}"' in script or f"'{c.header}'" in script)]
    assert written == []
    for old in ("speed NFE", "speed wall", "nfe (mean)", "tokens/forward"):  # the names the tooltip once wrote
        assert f'"{old}"' not in script
