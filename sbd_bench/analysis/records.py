"""Reading and writing a run folder's records, with no torch import (``report`` and ``compare`` use it).

A run folder holds:
  samples.jsonl   one JSON object per finished sample, appended and flushed as it finishes
  summary.json    schema_version, complete, provenance, rows, failures, cost_curve; written atomically

    >>> summary, records = load_run(Path("runs/x"))
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..types import SAMPLE_FIELDS, SCHEMA_VERSION, UsageError
from .metrics import json_safe

SAMPLES = "samples.jsonl"
SUMMARY = "summary.json"
REQUIRED_SAMPLE_FIELDS = ("task", "id", "solver", "config", "nfe", "tokens", "decode_time_s")


class RunFolderError(UsageError):
    """A run folder that cannot be read; the message says what is wrong and what to do."""


def write_text_atomic(path: Path, text: str) -> None:
    """Write to a temporary file beside ``path``, then rename: readers never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_json_atomic(path: Path, payload) -> None:
    write_text_atomic(path, json.dumps(json_safe(payload), indent=2, allow_nan=False) + "\n")


class RecordWriter:
    """Appends one JSON line per finished sample and flushes it, so an interruption loses nothing."""

    def __init__(self, path: Path):
        self.path = path
        self.handle = open(path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        self.handle.write(json.dumps(json_safe(record), allow_nan=False) + "\n")
        self.handle.flush()  # in the OS now: survives a killed process

    def close(self) -> None:
        self.handle.close()


def read_records(path: Path) -> list[dict]:
    """Every complete line of a samples file. A last line cut short by a killed process is skipped
    (``repair_tail`` removes it before more are appended); a bad line elsewhere is an error."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines) and not line.endswith("\n"):
                break  # a write interrupted mid-line
            raise RunFolderError(f"{path}:{number} is not valid JSON: the records are damaged; "
                                 f"delete that line or re-run into a new folder") from None
    return records


def repair_tail(path: Path) -> None:
    """Cut a partial last line (left by a killed process) so that appended records start clean."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as handle:
            handle.truncate(data.rfind(b"\n") + 1)


def read_summary(run_dir: Path) -> dict:
    path = Path(run_dir) / SUMMARY
    if not path.exists():
        raise RunFolderError(f"{run_dir} has no {SUMMARY}: it is not a run folder "
                             f"(make one with `python -m sbd_bench run --out {run_dir}`)")
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RunFolderError(f"{path} is not valid JSON ({exc.msg}): re-run `python -m sbd_bench run --resume {run_dir}`") from None
    version = summary.get("schema_version") if isinstance(summary, dict) else None
    if version != SCHEMA_VERSION:
        raise RunFolderError(f"{run_dir} holds records of schema version {version}, this sbd_bench reads version "
                             f"{SCHEMA_VERSION}: re-run it with this version, or read it with the sbd_bench that wrote it")
    return summary


def load_run(run_dir: Path) -> tuple[dict, list[dict]]:
    """(summary, records) of a run folder; bad input raises ``RunFolderError`` with one clear line."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunFolderError(f"run folder {run_dir} does not exist: give the --out folder of a `run`")
    summary = read_summary(run_dir)
    records = read_records(run_dir / SAMPLES)
    if not records:
        raise RunFolderError(f"{run_dir} has no records ({SAMPLES} is missing or empty): the run finished no "
                             f"sample; finish it with `python -m sbd_bench run --resume {run_dir}`")
    for number, rec in enumerate(records, start=1):
        missing = [f for f in REQUIRED_SAMPLE_FIELDS if f not in rec]
        if missing:
            raise RunFolderError(f"{run_dir / SAMPLES}:{number} lacks {', '.join(missing)}: records of another schema "
                                 f"version (this sbd_bench writes {', '.join(SAMPLE_FIELDS[:4])}, ...); re-run it")
    return summary, records
