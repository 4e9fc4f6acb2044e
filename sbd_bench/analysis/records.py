"""Reading and writing a run folder's records, with no torch import (``report`` and ``compare`` use it).

A run folder holds:
  samples.jsonl   one JSON object per finished sample, appended and flushed as it finishes
  summary.json    schema_version, complete, provenance, rows, failures, cost_curve, samples; written
                  atomically

    >>> summary, records = load_run(Path("runs/x"))
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Callable

from ..types import SAMPLE_FIELDS, SCHEMA_VERSION, UsageError
from .metrics import json_safe

SAMPLES = "samples.jsonl"
SUMMARY = "summary.json"
REQUIRED_SAMPLE_FIELDS = ("task", "id", "solver", "config", "nfe", "tokens", "decode_time_s")


class RunFolderError(UsageError):
    """A run folder that cannot be read; the message says what is wrong and what to do."""


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` to a temporary file beside ``path``, then rename: readers never see half a file. A
    write that fails (a full disk) removes the temporary file and names ``path`` in its error."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno is not None:
            exc.filename = str(path)  # the file the user asked for, not our temporary one
        raise


def write_text_atomic(path: Path, text: str) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


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


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _seconds(value) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                             and math.isfinite(value) and value >= 0)


def _counts(value) -> bool:
    return isinstance(value, list) and all(_count(v) for v in value)


def _text_or_none(value) -> bool:
    return value is None or isinstance(value, str)


# field -> (check, what it must be): every field a reader computes with, checked once when records
# are read, so that a damaged or hand-edited line is one clear error instead of a traceback later
FIELD_TYPES = {
    "task": (lambda v: isinstance(v, str), "a string"),
    "id": (lambda v: isinstance(v, (str, int)) and not isinstance(v, bool), "a string or an integer"),
    "solver": (lambda v: isinstance(v, str), "a string"),
    "config": (lambda v: isinstance(v, str), "a string"),
    "params": (lambda v: isinstance(v, dict), "an object"),
    "block_size": (lambda v: _count(v) and v >= 1, "an integer >= 1"),
    "repeat": (_count, "an integer >= 0"),
    "sample": (_count, "an integer >= 0"),  # sampled configurations only
    "seed": (_count, "an integer >= 0"),
    "prompt_tokens": (_count, "an integer >= 0"),
    "output_ids": (_counts, "a list of integers >= 0"),
    "output_text": (lambda v: isinstance(v, str), "a string"),
    "stop_reason": (_text_or_none, "a string"),
    "tokens": (_count, "an integer >= 0"),
    "nfe": (_count, "an integer >= 0"),
    "prefill_forwards": (_count, "an integer >= 0"),
    "revealed_per_forward": (_counts, "a list of integers >= 0"),
    "forwards_per_block": (_counts, "a list of integers >= 0"),
    "drafted_per_block": (lambda v: v is None or _counts(v), "a list of integers >= 0 or null"),  # verify mode
    "accepted_per_block": (lambda v: v is None or _counts(v), "a list of integers >= 0 or null"),
    "replaced_per_block": (lambda v: v is None or _counts(v), "a list of integers >= 0 or null"),
    "wall_time_s": (_seconds, "a number >= 0 or null"),
    "prefill_time_s": (_seconds, "a number >= 0 or null"),
    "decode_time_s": (_seconds, "a number >= 0 or null"),
    "correct": (lambda v: v is None or isinstance(v, bool), "true, false or null"),
    "answer": (_text_or_none, "a string or null"),
    "error": (_text_or_none, "a string or null"),
    "peak_memory_bytes": (lambda v: v is None or _count(v), "an integer >= 0 or null"),
    "memory": (lambda v: v is None or isinstance(v, dict), "an object or null"),
    "prompt_hash": (_text_or_none, "a string or null"),
    "prompt": (_text_or_none, "a string or null"),
    "batch_size": (lambda v: _count(v) and v >= 1, "an integer >= 1"),
}


def check_record(record, where: str) -> None:
    """Raise ``RunFolderError`` naming ``where`` (file:line) and the field when a record is malformed."""
    if not isinstance(record, dict):
        raise RunFolderError(f"{where}: expected a JSON object (one sample record per line); delete that line "
                             f"or re-run into a new folder")
    missing = [f for f in REQUIRED_SAMPLE_FIELDS if f not in record]
    if missing:
        raise RunFolderError(f"{where} lacks {', '.join(missing)}: records of another schema version (this sbd_bench "
                             f"writes {', '.join(SAMPLE_FIELDS[:4])}, ...); re-run it")
    for name, (valid, what) in FIELD_TYPES.items():
        if name in record and not valid(record[name]):
            raise RunFolderError(f"{where}: field '{name}' is {json.dumps(record[name])[:40]}, it must be {what}: "
                                 f"the record is damaged; correct or delete that line (then `run --resume` "
                                 f"decodes it again)")


def read_records(path: Path) -> list[dict]:
    """Every complete line of a samples file, each checked field by field (``check_record``). A last
    line cut short by a killed process is skipped (``repair_tail`` removes it before more are
    appended); a bad line elsewhere is an error naming the file and the line."""
    return read_json_lines(path, check_record, "the records are damaged; delete that line or re-run into a new folder")


def read_json_lines(path: Path, check: Callable[[object, str], None], damaged: str) -> list:
    """Every complete line of a JSON-lines file ([] when there is none), each checked by ``check(value,
    "file:line")``. A last line cut short by a killed process is skipped; a line elsewhere that is not
    UTF-8 JSON is an error naming the file and the line, then ``damaged`` (what to do about it)."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_bytes().splitlines(keepends=True)
    values = []
    for number, raw in enumerate(lines, start=1):
        last_cut = number == len(lines) and not raw.endswith(b"\n")
        try:
            line = raw.decode("utf-8")
            if not line.strip():
                continue
            value = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if last_cut:
                break  # a write interrupted mid-line
            what = "is not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else "is not valid JSON"
            raise RunFolderError(f"{path}:{number} {what}: {damaged}") from None
        check(value, f"{path}:{number}")
        values.append(value)
    return values


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
        if (Path(run_dir) / SAMPLES).exists():
            raise RunFolderError(f"{run_dir} holds {SAMPLES} but no {SUMMARY}, so its settings are unknown: continue it "
                                 f"by running the command that started it again, with `--out {run_dir}` (the records "
                                 f"there are kept and checked against that command's plan)")
        raise RunFolderError(f"{run_dir} has no {SUMMARY}: it is not a run folder "
                             f"(make one with `python -m sbd_bench run --out {run_dir}`)")
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        why = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8 text"
        raise RunFolderError(f"{path} is not valid JSON ({why}): the summary is damaged; delete it and continue the "
                             f"run with the command that started it and `--out {run_dir}`") from None
    version = summary.get("schema_version") if isinstance(summary, dict) else None
    if version != SCHEMA_VERSION:
        raise RunFolderError(f"{run_dir} holds records of schema version {version}, this sbd_bench reads version "
                             f"{SCHEMA_VERSION}: re-run it with this version, or read it with the sbd_bench that wrote it")
    for name, kind in (("provenance", dict), ("rows", list), ("failures", list)):
        if summary.get(name) is not None and not isinstance(summary[name], kind):
            raise RunFolderError(f"{path}: field '{name}' must be a JSON {'object' if kind is dict else 'list'}: "
                                 f"the summary is damaged; delete it and continue the run with the command that "
                                 f"started it and `--out {run_dir}`")
    return summary


def load_run(run_dir: Path) -> tuple[dict, list[dict]]:
    """(summary, records) of a run folder; bad input raises ``RunFolderError`` with one clear line."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():  # e.g. the summary.json or samples.jsonl of a run
        holder = run_dir.parent
        held = (holder / SUMMARY).is_file() or (holder / SAMPLES).is_file()
        raise RunFolderError(f"{run_dir} is a file: give the run folder "
                             + (f"that holds it: {holder}" if held else "(the --out folder of a `run`)"))
    if not run_dir.is_dir():
        raise RunFolderError(f"run folder {run_dir} does not exist: give the --out folder of a `run`")
    summary = read_summary(run_dir)
    records = read_records(run_dir / SAMPLES)
    if not records:
        raise RunFolderError(f"{run_dir} has no records ({SAMPLES} is missing or empty): the run finished no "
                             f"sample; finish it with `python -m sbd_bench run --resume {run_dir}`")
    return summary, records


# ------------------------------------------------------------------------------------ output paths
def prepare_output_folder(path: Path, flag: str = "--out", keep: bool = True, write: bool = True) -> list[Path]:
    """Make sure ``path`` can be written as a folder before any work starts: refuse a file, a path
    under a file, and a place that cannot be written (permissions, a read-only or special file system
    such as /proc), each in one line. Creates what is missing and returns the folders it created; with
    ``keep=False`` it removes them again (a probe that leaves nothing behind); with ``write=False`` it
    makes and writes nothing (the checks of the path alone: another process probes it)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunFolderError(f"{flag} {path} is a file, not a folder: give a folder path")
    existing = next(p for p in (path, *path.parents) if p.exists() or p == Path(p.anchor or "."))
    if not existing.is_dir():
        raise RunFolderError(f"{flag} {path} lies under {existing}, which is a file: give a folder path")
    if not write:
        return []
    missing = [p for p in (path, *path.parents) if not p.exists()][::-1]  # outermost first
    created: list[Path] = []
    try:
        for folder in missing:
            try:
                folder.mkdir()
            except FileExistsError:  # made meanwhile by another process (torchrun's ranks start together)
                if not folder.is_dir():
                    raise
                continue
            created.append(folder)
        probe = path / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        remove_empty_folders(created)
        raise RunFolderError(f"cannot write to {flag} {path} ({exc.strerror or exc}): give a folder you can "
                             f"write to") from None
    if not keep:
        remove_empty_folders(created)
        return []
    return created


def remove_empty_folders(folders: list[Path]) -> None:
    """Remove the folders (given outermost first) that are still empty, innermost first."""
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:
            pass  # not empty, or gone: leave it


def check_output_file(path: Path, example: str, ours: Callable[[Path], bool], command: str, flag: str = "--out") -> None:
    """Refuse, before any work, an output file path that is a folder, whose folder cannot be written, or
    that holds a file ``command`` did not write (``ours`` tells): writing would replace it. The name
    suggested instead (``example`` in that folder) is one that does not exist yet."""
    path = Path(path)
    if path.is_dir():
        raise RunFolderError(f"{flag} {path} is a folder: give a file name, e.g. {flag} {free_path(path / example)}")
    if path.exists() and not path.is_file():  # a pipe or a device: reading it to tell (``ours``) could block
        raise RunFolderError(f"{flag} {path} is not a regular file (a device, a pipe or a socket): give a file name, "
                             f"e.g. {flag} {free_path(path.parent / example)}")
    if path.exists() and not ours(path):
        raise RunFolderError(f"{flag} {path} is a file `{command}` did not write, which writing would replace: give "
                             f"a new file name, e.g. {flag} {free_path(path.parent / example)}")
    prepare_output_folder(path.parent, flag, keep=False)


def free_path(path: Path) -> Path:
    """``path`` if nothing is there, else the first of NAME-2.EXT, NAME-3.EXT, ... that is free."""
    path = candidate = Path(path)
    number = 2
    while candidate.exists() or candidate.is_symlink():
        candidate = path.with_name(f"{path.stem}-{number}{path.suffix}")
        number += 1
    return candidate


def is_run_summary(path: Path) -> bool:
    """Whether ``path`` is a summary.json a run wrote (a JSON object with schema_version and provenance)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and "schema_version" in data and "provenance" in data


def starts_with(path: Path, prefix: str) -> bool:
    """Whether the file ``path`` begins with ``prefix`` (how a command knows a file it wrote before)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(prefix.encode())) == prefix.encode()
    except OSError:
        return False


# ------------------------------------------------------------------------------------- the run lock
LOCK = "run.lock"


class RunFolderBusy(RunFolderError):
    """Another process is writing the run folder."""


class RunFolderLock:
    """One writer per run folder: an exclusive ``flock`` on ``run.lock`` in the folder, held for the
    run's life, the file holding the holder's pid and command. A second writer is refused at once.
    The file is removed on release (while still locked; a waiter that locked the removed file notices
    that the path now names another file, and tries again), so a finished folder holds no lock file.

        with RunFolderLock(Path("runs/x"), command="python -m sbd_bench run ..."):
            ...                                        # records and summary are ours alone here
    """

    def __init__(self, folder: Path, command: str = ""):
        self.path = Path(folder) / LOCK
        self.command = command
        self.fd: int | None = None

    def __enter__(self) -> "RunFolderLock":
        try:
            import fcntl
        except ImportError:  # not a POSIX system: runs there are not guarded against a second writer
            return self
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise RunFolderError(f"cannot write to the run folder {self.path.parent} ({exc.strerror or exc}): "
                                     f"give a folder you can write to") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 4096).decode("utf-8", "replace").strip()
                os.close(fd)
                raise RunFolderBusy(f"{self.path.parent} is being written by another run ({holder or 'pid unknown'}): "
                                    f"wait for it to end, or choose another --out") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # we locked a file its holder had just removed: lock the one at the path now
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}: {self.command}".encode())
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
            os.close(self.fd)  # closing the descriptor releases the lock
            self.fd = None
