"""scripts/same_records.py: two runs' records compared apart from timings and memory."""
from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

from measure_fixtures import crafted_record, crafted_run

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("same_records", ROOT / "scripts" / "same_records.py")
same_records = importlib.util.module_from_spec(spec)
spec.loader.exec_module(same_records)


def test_timings_differ_outputs_do_not(tmp_path, capsys):
    records = [crafted_record(c, "arith", str(i), nfe=4, tokens=8, correct=True, decode_time_s=0.1)
               for i in range(3) for c in ("ntp", "fixed_k:k=2")]
    slower = copy.deepcopy(records)
    for r in slower:
        r["decode_time_s"], r["peak_memory_bytes"] = 9.0, 123
    a, b = crafted_run(tmp_path / "a", records), crafted_run(tmp_path / "b", slower)
    assert same_records.main([str(a), str(b)]) == 0
    assert capsys.readouterr().out.strip() == "6 records, 0 differences (timings and memory ignored)"
    slower[3]["nfe"], slower[3]["revealed_per_forward"] = 5, [2, 2, 2, 1, 1]
    assert same_records.main([str(a), str(crafted_run(tmp_path / "c", slower))]) == 1
    assert "record 4 (arith 1 fixed_k:k=2): nfe, revealed_per_forward" in capsys.readouterr().out
    assert same_records.main([str(a), str(crafted_run(tmp_path / "d", records[:5]))]) == 1
    assert same_records.main([str(a), str(tmp_path / "nothing")]) == 2
