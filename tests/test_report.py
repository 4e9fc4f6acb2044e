"""`report` builds its tables and plots from a fixture run folder, reading only records, without
importing torch; bad run folders give one line and a non-zero exit."""
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from measure_fixtures import crafted_record, crafted_run, standard_records
from sbd_bench.analysis import report
from sbd_bench.cli import main

ROOT = Path(__file__).resolve().parent.parent
CURVE = {"block_size": 4, "context": 16, "reps": 5, "device": "cpu", "query_tokens": [1, 4, 5, 8],
         "time_s": [0.001, 0.002, 0.0022, 0.003]}


@pytest.fixture
def run_dir(tmp_path):
    return crafted_run(tmp_path / "run", standard_records(), cost_curve=CURVE)


def test_report_writes_tables_and_plots(run_dir):
    path = report.write_report(run_dir)
    assert path == run_dir / "report.md"
    for name in ("table.csv", "rows.csv", "accuracy_vs_speed.png", "tokens_per_forward.png", "forwards_per_block.png"):
        assert (run_dir / name).stat().st_size > 0, name
    for name in ("accuracy_vs_speed.png", "tokens_per_forward.png", "forwards_per_block.png"):
        assert (run_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = list(csv.reader((run_dir / "table.csv").open()))
    assert table[0] == ["config", "arith", "copy"]
    cells = {row[0]: row[1:] for row in table[1:]}
    assert cells["ntp"] == ["100.0 / 1.00x", "100.0 / 1.00x"]
    assert cells["fixed_k:k=4"][0].startswith("60.0 / ")
    text = path.read_text()
    assert "| ntp | 100.0 / 1.00x | 100.0 / 1.00x |" in text and "predicted (measured curve)" in text
    assert "Incomplete run" not in text
    rows = list(csv.DictReader((run_dir / "rows.csv").open()))
    assert {r["config"] for r in rows} == set(cells) and "pred_measured" in rows[0]


def test_accuracy_vs_speed_axes(tmp_path):
    from sbd_bench.analysis.metrics import summarize

    rows = summarize(standard_records())
    fig = report.plot_accuracy_vs_speed(rows, tmp_path / "p.png")
    speed = {(r["config"], r["task"]): r["speed_factor_nfe"] for r in rows}
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["arith", "copy"]
    for ax in axes:
        assert ax.get_xlim()[0] == 0 and "relative to NTP" in ax.get_xlabel()
        [front] = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
        # entropy_bounded (100%, 2.09x) and fixed_k (60%, 3.6x) are on the front; ntp (100%, 1x) is dominated
        expected = sorted(speed[(c, ax.get_title())] for c in ("entropy_bounded:gamma=0.35,proxy=entropy", "fixed_k:k=4"))
        assert sorted(front.get_xdata()) == pytest.approx(expected) and expected[0] > 1


def test_incomplete_run_is_flagged(tmp_path):
    run_dir = crafted_run(tmp_path / "run", standard_records(n=2), complete=False)
    assert "Incomplete run" in report.write_report(run_dir).read_text()


def test_pareto_front():
    points = [(1.0, 0.9), (2.0, 0.8), (2.0, 0.7), (1.5, 0.6), (3.0, 0.8), (0.5, 0.95)]
    assert report.pareto_front(points) == [(0.5, 0.95), (1.0, 0.9), (3.0, 0.8)]


def test_report_and_compare_do_not_import_torch(run_dir, tmp_path):
    code = (f"import sys; from sbd_bench.cli import main; "
            f"assert main(['report', {str(run_dir)!r}]) == 0; "
            f"assert main(['compare', {str(run_dir)!r}, {str(run_dir)!r}]) == 0; "
            f"assert main(['roofline', {str(run_dir)!r}]) == 0; "
            f"heavy = [m for m in ('torch', 'transformers', 'sbd_bench.core.decoding', 'sbd_bench.runner.harness') if m in sys.modules]; "
            f"assert not heavy, heavy")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: ")
    return err


def test_run_folder_without_records(tmp_path, capsys):
    run_dir = crafted_run(tmp_path / "run", [])
    assert "has no records" in one_line_error(capsys, ["report", str(run_dir)])
    assert "does not exist" in one_line_error(capsys, ["report", str(tmp_path / "nowhere")])
    (tmp_path / "empty").mkdir()
    assert "not a run folder" in one_line_error(capsys, ["report", str(tmp_path / "empty")])


def test_records_of_another_schema_version(run_dir, capsys):
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["schema_version"] = 99
    (run_dir / "summary.json").write_text(json.dumps(summary))
    assert "schema version 99" in one_line_error(capsys, ["report", str(run_dir)])


def test_records_missing_fields(tmp_path, capsys):
    rec = crafted_record("ntp", "t", "0", nfe=3, tokens=3, correct=True, decode_time_s=0.1)
    del rec["nfe"]
    run_dir = crafted_run(tmp_path / "run", [rec])
    assert "another schema" in one_line_error(capsys, ["report", str(run_dir)])


def test_damaged_last_line_is_skipped(run_dir):
    with open(run_dir / "samples.jsonl", "a") as handle:
        handle.write('{"task": "arith", "id"')  # a write cut short by a killed process
    report.write_report(run_dir)
    with open(run_dir / "samples.jsonl", "a") as handle:
        handle.write('\n{"ok": 1}\n')  # now damage in the middle: an error, not a silent skip
    from sbd_bench.analysis.records import RunFolderError, read_records

    with pytest.raises(RunFolderError):
        read_records(run_dir / "samples.jsonl")
