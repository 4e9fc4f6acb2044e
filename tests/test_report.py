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


# ------------------------------------------------------------------- the plots, looked at as a user
def speed_row(config: str, task: str, speed: float, accuracy: float, wall: float | None = None) -> dict:
    """A summary row with just what the accuracy-vs-speed plot reads."""
    return {"config": config, "task": task, "accuracy": accuracy, "speed_factor_nfe": speed,
            "speed_factor_wall": wall}


# the committed baseline's arith panel: left_to_right's 1.0008x is NTP's 1.00x with an answer a token shorter
ARITH = [("ntp", 1.0, 1.0), ("confidence:tau=0.9", 4.84453373015873, 0.25),
         ("entropy_bounded:gamma=0.35,proxy=entropy", 6.350535714285715, 0.325), ("factor:f=1.0", 5.55875, 0.275),
         ("fixed_k:k=2", 1.9796875, 0.25), ("left_to_right:n=1", 1.0008064516129032, 0.65),
         ("random_order:n=2", 1.9796875, 0.025)]


def test_pareto_front_treats_speeds_within_one_percent_as_ties():
    front = report.pareto_front([(x, y) for _, x, y in ARITH])
    assert front == [(1.0, 1.0), (6.350535714285715, 0.325)]  # no step down from NTP to left_to_right
    assert report.pareto_front([(1.0, 1.0), (1.02, 0.65)]) == [(1.0, 1.0), (1.02, 0.65)]  # 2% faster: a real trade
    assert report.pareto_front([(7.0, 1.0)] * 3 + [(1.0, 1.0)]) == [(7.0, 1.0)]  # one spot, drawn once
    assert not report.dominates((1.0, 0.5), (1.0, 0.5)) and report.dominates((1.0, 0.6), (1.009, 0.5))


def test_accuracy_vs_speed_front_skips_a_dominated_tie(tmp_path):
    rows = [speed_row(c, "arith", x, y, wall=x / 2) for c, x, y in ARITH]
    fig = report.plot_accuracy_vs_speed(rows, tmp_path / "p.png")
    [ax] = [ax for ax in fig.axes if ax.get_visible()]
    [front] = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert list(front.get_xdata()) == [1.0, 6.350535714285715] and list(front.get_ydata()) == [100.0, 32.5]


def marker_spots(ax) -> list[tuple[float, float, tuple, bool]]:
    """(x, y) in display pixels, edge colour and filled-or-not of every scatter marker of a panel."""
    spots = []
    for coll in ax.collections:
        [xy] = coll.get_offset_transform().transform(coll.get_offsets())
        filled = len(coll.get_facecolors()) > 0 and coll.get_facecolors()[0][3] > 0
        spots.append((xy[0], xy[1], tuple(coll.get_edgecolors()[0]), filled))
    return spots


def test_markers_on_one_spot_are_all_visible(tmp_path):
    # reverse in the baseline: three solvers at (7.00x, 100%), NTP and two ablations at (1.00x, 100%)
    rows = [speed_row(c, "reverse", x, 1.0, wall=w) for c, x, w in [
        ("ntp", 1.0, 1.0), ("confidence:tau=0.9", 7.0, 3.6), ("entropy_bounded:gamma=0.35,proxy=entropy", 7.0, 3.5),
        ("factor:f=1.0", 7.0, 3.4), ("left_to_right:n=1", 1.0, 0.55), ("random_order:n=2", 1.0, 0.54)]]
    fig = report.plot_accuracy_vs_speed(rows, tmp_path / "p.png")
    [ax] = [ax for ax in fig.axes if ax.get_visible()]
    spots = marker_spots(ax)
    assert len(spots) == 2 * len(rows)  # every configuration, NFE and wall-clock, has its marker
    assert len({colour for _, _, colour, _ in spots}) == len(rows)
    width_px = report.MARKER_AREA ** 0.5 * fig.dpi / 72
    for i, (x1, y1, *_) in enumerate(spots):
        for x2, y2, *_ in spots[i + 1:]:
            assert ((x1 - x2) ** 2 + (y1 - y2) ** 2) ** 0.5 >= width_px, "two markers cover each other"
    # and none strays far from its true spot: the three at 7.00x stay within two marker widths of it
    true_7 = ax.transData.transform((7.0, 100.0))
    at_7 = [(x, y) for x, y, _, filled in spots if filled and abs(x - true_7[0]) < 3 * width_px]
    assert len(at_7) == 3 and all(abs(x - true_7[0]) <= 2 * width_px and abs(y - true_7[1]) <= 2 * width_px
                                  for x, y in at_7)


def test_no_marker_is_drawn_outside_0_to_100_percent(tmp_path):
    # record in the baseline: seven configurations at 100% within a marker's width of one another, and
    # at 0% the same crowd; moved up or down to stay visible, one was drawn at 106%
    configs = ["ntp", "confidence:tau=0.9", "entropy_bounded:gamma=0.35,proxy=entropy", "factor:f=1.0",
               "fixed_k:k=2", "left_to_right:n=1", "random_order:n=2", "fixed_k:k=16,verify=on"]
    rows = [speed_row(c, task, 13.53 if i % 2 else 1.0, accuracy, wall=6.5 if i % 2 else 0.5)
            for task, accuracy in (("record", 1.0), ("tag", 0.0)) for i, c in enumerate(configs)]
    fig = report.plot_accuracy_vs_speed(rows, tmp_path / "p.png")
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 2
    width_px = report.MARKER_AREA ** 0.5 * fig.dpi / 72
    for ax, accuracy in zip(panels, (100.0, 0.0)):
        spots = marker_spots(ax)
        assert len(spots) == 2 * len(configs)
        drawn = [ax.transData.inverted().transform((x, y)) for x, y, *_ in spots]  # back to (speed, accuracy %)
        assert all(-1e-6 <= y <= 100 + 1e-6 for _, y in drawn), drawn  # inside the accuracy axis' range
        assert all(abs(y - accuracy) < 8 for _, y in drawn), drawn  # near its own: two rows below/above at most
        assert all(x >= 0 for x, _ in drawn), drawn  # and none left of a speed factor of 0
        for i, (x1, y1, *_) in enumerate(spots):  # and still none covers another
            assert all(((x1 - x2) ** 2 + (y1 - y2) ** 2) ** 0.5 >= width_px for x2, y2, *_ in spots[i + 1:])


def test_spread_markers_keeps_the_first_on_its_spot():
    assert report.spread_markers([(0.0, 0.0), (100.0, 0.0)], width=10) == [(0.0, 0.0), (0.0, 0.0)]
    offsets = report.spread_markers([(0.0, 0.0)] * 3, width=10)
    assert offsets[0] == (0.0, 0.0) and {abs(dx) for dx, _ in offsets[1:]} == {12.0}  # sideways first
    # at the top of the range (100%), on the left edge (speed 0): right, then below, never above or left
    offsets = report.spread_markers([(0.0, 100.0)] * 4, width=10, bounds=(0.0, 500.0, 0.0, 100.0))
    assert offsets[:2] == [(0.0, 0.0), (12.0, 0.0)] and all(dx >= 0 and dy <= 0 for dx, dy in offsets)
    assert len(set(offsets)) == 4


def test_accuracy_vs_speed_legend_says_filled_and_hollow(tmp_path):
    from sbd_bench.analysis.metrics import summarize

    fig = report.plot_accuracy_vs_speed(summarize(standard_records()), tmp_path / "p.png")
    [legend] = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert "filled: speed factor from NFE" in labels and "hollow: speed factor from wall-clock" in labels
    assert "Pareto front (NFE)" in labels and {"ntp", "fixed_k:k=4"} <= set(labels)
    assert min(t.get_fontsize() for t in legend.get_texts()) >= 9
    assert fig.get_suptitle()


@pytest.mark.parametrize("field", ["revealed_per_forward", "forwards_per_block"])
def test_distribution_plots_per_task_with_discrete_colours(tmp_path, field):
    from matplotlib.colors import to_rgb

    from sbd_bench.analysis.metrics import summarize

    records = standard_records(tasks=("tag", "arith"))
    fig = report.plot_distribution(records, summarize(records), field, "A title: share", "forwards", tmp_path / "d.png")
    assert fig.get_suptitle() == "A title: share"
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["tag", "arith"]  # one panel per task, run order
    assert all(ax.get_ylabel() == "" for ax in fig.axes)  # no colour bar axis among them
    [legend] = fig.legends
    values = {v for r in records for v in r[field]}
    bins = report.count_bins(max(values), with_zero=0 in values)
    assert [t.get_text() for t in legend.get_texts()] == [label for *_, label in bins]
    colours = [to_rgb(c) for c in report.bin_colors(bins)]
    for i, a in enumerate(colours):  # every pair of values clearly apart, 1 and 2 included
        for b in colours[i + 1:]:
            assert sum((x - y) ** 2 for x, y in zip(a, b)) ** 0.5 > 0.25
    # the configurations' bars of the first panel (tag) show NTP on top, as the tables do
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[-1] == "ntp"


def test_count_bins():
    assert [label for *_, label in report.count_bins(16, with_zero=True)] == ["0", "1", "2", "3", "4", "5–8", "9–16"]
    assert [label for *_, label in report.count_bins(2, with_zero=False)] == ["1", "2"]
    assert report.count_bins(32, False)[-1] == (17, 32, "17–32")


def test_bin_colours_are_clearly_apart_for_a_whole_block():
    from matplotlib.colors import to_rgb

    for bins in (report.count_bins(16, with_zero=True), report.count_bins(128, with_zero=False)):
        colours = [to_rgb(c) for c in report.bin_colors(bins)]
        for i, a in enumerate(colours):  # 1 and 2 (and every other pair) must not look alike
            for b in colours[i + 1:]:
                assert sum((x - y) ** 2 for x, y in zip(a, b)) ** 0.5 > 0.25, (a, b)


# ------------------------------------------------------------------------------- report.md, read
def tables(text: str) -> list[list[list[str]]]:
    """Every Markdown table of a text: rows of cells, the header first, the |---| line dropped."""
    found, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            if not line.startswith("|---"):
                current.append([c.strip() for c in line.strip("|").split(" | ")])
        elif current:
            found.append(current)
            current = []
    return found


def test_every_table_has_the_same_task_and_config_order(tmp_path):
    records = standard_records(tasks=("tag", "arith"))
    records = [r for r in records if r["solver"] != "ntp"] + [r for r in records if r["solver"] == "ntp"]  # ntp last
    run_dir = crafted_run(tmp_path / "run", records, cost_curve=CURVE)
    found = tables(report.write_report(run_dir).read_text())
    main, families, *details = found
    assert main[0] == ["config", "tag", "arith"]
    configs = [row[0] for row in main[1:]]
    assert configs[0] == "ntp"
    assert [row[0] for row in families[1:]] == ["ntp", "entropy_bounded", "fixed_k"]  # configs' order, by family
    assert [h.split()[0] for h in families[0][1:3]] == ["tag", "arith"]
    assert len(details) == 3
    for table in details:
        assert table[0][:2] == ["task", "config"]
        assert [row[:2] for row in table[1:]] == [[t, c] for t in ("tag", "arith") for c in configs]
        assert len(table[0]) <= 9  # narrow enough to read
    assert next(csv.reader((run_dir / "table.csv").open())) == ["config", "tag", "arith"]


def test_rows_with_a_different_output_length_are_marked(tmp_path):
    records = standard_records(n=3)
    for r in records:
        if r["config"] == "fixed_k:k=4" and r["task"] == "arith":  # answers 30% shorter than NTP's
            r["tokens"] = r["tokens"] * 7 // 10
    run_dir = crafted_run(tmp_path / "run", records)
    text = report.write_report(run_dir).read_text()
    main, _families, accuracy_speed, _predicted, profile = tables(text)
    cells = {row[0]: row[1:] for row in main[1:]}
    assert cells["fixed_k:k=4"][0].endswith(report.LENGTH_MARK) and not cells["fixed_k:k=4"][1].endswith(report.LENGTH_MARK)
    assert not any(report.LENGTH_MARK in c for c in cells["ntp"] + cells["entropy_bounded:gamma=0.35,proxy=entropy"])
    marked = [row[:2] for row in accuracy_speed[1:] if report.LENGTH_MARK in " ".join(row)]
    assert marked == [["arith", "fixed_k:k=4"]]
    tokens_vs_ntp = {(row[0], row[1]): row[profile[0].index("tokens vs NTP")] for row in profile[1:]}
    assert tokens_vs_ntp[("arith", "fixed_k:k=4")] == f"0.67x {report.LENGTH_MARK}"  # 20 of 30 tokens
    assert tokens_vs_ntp[("arith", "ntp")] == "1.00x"
    assert text.count(report.LENGTH_FOOTNOTE) == 3  # under the main table and each marked table
    rows = list(csv.DictReader((run_dir / "rows.csv").open()))
    assert {r["config"] for r in rows if r["tokens_differ_from_ntp"] == "True"} == {"fixed_k:k=4"}


def test_report_without_a_marked_row_has_no_footnote(run_dir):
    assert report.LENGTH_FOOTNOTE not in report.write_report(run_dir).read_text()


def test_a_non_monotone_cost_curve_is_explained(tmp_path):
    inverted = {**CURVE, "query_tokens": [1, 4, 5, 8], "time_s": [0.001, 0.0024, 0.0021, 0.003]}
    text = report.write_report(crafted_run(tmp_path / "a", standard_records(n=2), cost_curve=inverted)).read_text()
    assert "not monotone: q=5 took 2.100 ms, less than q=4 (2.400 ms)" in text and "timing noise" in text
    text = report.write_report(crafted_run(tmp_path / "b", standard_records(n=2), cost_curve=CURVE)).read_text()
    assert "not monotone" not in text
    assert report.non_monotone({1: 1.0, 16: 1.6, 17: 1.5, 32: 1.4}) == [(16, 17), (17, 32)]


def test_aup_per_family_with_y_max_in_the_table_and_every_row(tmp_path):
    from sbd_bench.analysis.yardsticks import aup

    records = standard_records(tasks=("arith", "copy"))
    records = [r for r in records if not (r["config"] == "fixed_k:k=4" and r["task"] == "copy")]  # no copy for it
    run_dir = crafted_run(tmp_path / "run", records)
    text = report.write_report(run_dir).read_text()
    families = tables(text)[1]
    assert families[0] == ["family", "arith AUP (y_max 100.0)", "copy AUP (y_max 100.0)", "mean AUP"]
    cells = {row[0]: row[1:] for row in families[1:]}
    eb = aup([(1.0, 100.0), (50 / 24, 100.0)], 100.0)  # NTP's point, then entropy_bounded's: 50 tokens, 24 forwards
    assert cells["entropy_bounded"] == [f"{eb:.1f} [200.0, 218.2]", f"{eb:.1f} [200.0, 218.2]", f"{eb:.1f}"]
    assert cells["fixed_k"][0].endswith("(1 of 2 points)")  # 60%: more than 5 below NTP's 100%, dropped
    assert cells["fixed_k"][1:] == ["-", "-"]  # no copy: no AUP there, no mean over the run's tasks
    rows = list(csv.DictReader((run_dir / "rows.csv").open()))
    eb_rows = [r for r in rows if r["config"].startswith("entropy_bounded")]
    assert {r["family"] for r in eb_rows} == {"entropy_bounded"} and {r["aup_y_max"] for r in eb_rows} == {"100.0"}
    assert float(eb_rows[0]["aup"]) == pytest.approx(eb)
