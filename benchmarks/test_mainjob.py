"""The main job's record set (benchmarks/mainjob.py), checked once per CI run: it fails when any
configuration's outputs, NFE or per-block counts on the default suite move from the committed
fingerprints. Untimed here; `tox -e mainjob` prints how long the job took."""
import json

import mainjob


def test_main_job_records_unchanged(tmp_path, capsys):
    assert mainjob.main(["--out", str(tmp_path / "run")]) == 0, capsys.readouterr().out


def test_a_changed_record_is_named(tmp_path):
    records = [{"config": "ntp", "task": "arith", "id": i, "nfe": 5, "output_ids": [1, 2], "wall_time_s": i / 10,
                "batch_size": 1} for i in range(3)]
    base = mainjob.fingerprints(records)
    assert mainjob.changes(base, mainjob.fingerprints([{**r, "wall_time_s": 9.0, "batch_size": 16} for r in records])) == []
    moved = [dict(r) for r in records]
    moved[1]["nfe"] = 4
    assert mainjob.changes(base, mainjob.fingerprints(moved)) == [
        "ntp | arith: 3 records, other outputs/NFE/counts than the committed 3"]
    assert mainjob.changes(base, {}) == ["ntp | arith: not in the main job any more"]
    json.dumps(base)  # the committed file is this dict
