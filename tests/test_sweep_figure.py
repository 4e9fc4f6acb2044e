"""scripts/sweep_figure.py: the model card's γ sweep figure, from a run folder's records alone."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from measure_fixtures import crafted_record, crafted_run

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("sweep_figure", ROOT / "scripts" / "sweep_figure.py")
sweep_figure = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sweep_figure)


def sweep_records() -> list[dict]:
    """NTP (8 forwards) and EB at three γ on two tasks; γ=1 and γ=4 land on the same spot of `copy`."""
    records = []
    for task in ("copy", "arith"):
        for i in range(4):
            records.append(crafted_record("ntp", task, str(i), nfe=8, tokens=8, correct=True, decode_time_s=0.08))
            for gamma, nfe in ((0.0, 8), (1.0, 2), (4.0, 2 if task == "copy" else 1)):
                r = crafted_record(f"entropy_bounded:gamma={gamma}", task, str(i), nfe=nfe, tokens=8,
                                   correct=task == "copy" or gamma == 0.0 or i < 2, decode_time_s=0.01 * nfe)
                r["params"] = {"gamma": gamma, "proxy": "entropy"}
                records.append(r)
    return records


def test_points_per_task_in_parameter_order_and_shared_labels(tmp_path):
    from sbd_bench.analysis.metrics import summarize

    rows = summarize(sweep_records())
    points = sweep_figure.sweep_points(rows, "entropy_bounded", "gamma")
    assert list(points) == ["copy", "arith"]  # the run's order, not sorted
    assert points["arith"] == [(1.0, 1.0, 0.0), (4.0, 0.5, 1.0), (8.0, 0.5, 4.0)]
    assert sweep_figure.label_groups(points["copy"]) == {(1.0, 1.0): "0", (4.0, 1.0): "1,4"}
    five = [(2.0, 1.0, g) for g in (0.1, 0.2, 0.3, 0.4)]
    assert sweep_figure.label_groups(five) == {(2.0, 1.0): "0.1…0.4"}


def test_writes_a_figure_and_refuses_a_run_without_the_sweep(tmp_path, capsys):
    run = crafted_run(tmp_path / "run", sweep_records())
    out = tmp_path / "fig" / "sweep.png"
    assert sweep_figure.main([str(run), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sweep_figure.main([str(run), "--param", "tau", "--out", str(out)]) == 2
    assert "holds no entropy_bounded rows with parameter tau" in capsys.readouterr().err
