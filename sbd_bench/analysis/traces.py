"""The per-forward trace of traced samples (``traces.jsonl``), read and checked, with no torch import.

    >>> traces = read_traces(Path("runs/x") / TRACES)      # [] when the run traced nothing
    >>> trace_problems(traces[0], record)                    # [] when the trace adds up to its record

One JSON line per traced sample, keyed like its sample record (``task``, ``id``, ``config``, ``repeat``,
``sample`` where sampled), with ``block_size``, ``pieces`` (token id -> decoded text, for every id
below) and ``forwards``: one object per forward of the sample's NFE, in order (docs/records.md, 'Traces'):
  n          1-based forward number
  kind       "ntp" (one slot), "block", or "verify" (a verified block's first forward, which judges the
             previous block's drafts)
  start      output index of the block's first slot; size: slots in the block (0: a final check)
  masked     slots masked when the forward ran; revealed: slots it revealed; revoked: slots it masked
             again (revoking solvers)
  tokens     token id per slot after the forward, -1 where masked
  entropy, confidence  per slot, null where the slot was not masked
  committed  token ids this forward added to the output
  drafted, accepted, rejected_slot   verify forwards only: the previous block's drafts judged, those
             NTP confirmed, and the slot of the draft NTP replaced (null when none was)
"""
from __future__ import annotations

import json
from pathlib import Path

from .metrics import sample_key
from .records import FIELD_TYPES, RunFolderError, read_json_lines

TRACES = "traces.jsonl"
FORWARD_KINDS = ("ntp", "block", "verify")


def _int(value, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _slots(value, size: int) -> bool:
    return isinstance(value, list) and all(_int(v) and v < size for v in value)


def _proxies(value, size: int) -> bool:
    return isinstance(value, list) and len(value) == size and all(
        v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in value)


def forward_problem(forward, block_size: int) -> str | None:
    """What is wrong with one forward of a trace (None when nothing is): the field and what it must be."""
    if not isinstance(forward, dict):
        return "is not a JSON object"
    if forward.get("kind") not in FORWARD_KINDS:
        return f"field 'kind' is {json.dumps(forward.get('kind'))}, it must be one of {', '.join(FORWARD_KINDS)}"
    for name in ("n", "start", "size"):
        if not _int(forward.get(name), 1 if name == "n" else 0):
            return f"field '{name}' is {json.dumps(forward.get(name))}, it must be an integer >= {int(name == 'n')}"
    size = forward["size"]
    if size > block_size or (forward["kind"] == "ntp" and size != 1):
        return f"field 'size' is {size}, it must be 1 for an NTP forward and at most block_size ({block_size})"
    for name in ("masked", "revealed", "revoked"):
        if not _slots(forward.get(name, []), size):
            return f"field '{name}' must be a list of slot indices 0..{size - 1}"
    tokens = forward.get("tokens")
    if not (isinstance(tokens, list) and len(tokens) == size and all(_int(t, -1) for t in tokens)):
        return f"field 'tokens' must be {size} token ids (-1 where masked)"
    for name in ("entropy", "confidence"):
        if not _proxies(forward.get(name), size):
            return f"field '{name}' must be {size} numbers or nulls"
    if not (isinstance(forward.get("committed"), list) and all(_int(t) for t in forward["committed"])):
        return "field 'committed' must be a list of token ids"
    if forward["kind"] == "verify":
        for name in ("drafted", "accepted"):
            if not _int(forward.get(name)):
                return f"field '{name}' must be an integer >= 0 on a verify forward"
        rejected = forward.get("rejected_slot")
        if rejected is not None and not _int(rejected):
            return "field 'rejected_slot' must be a slot index or null"
    return None


def check_trace(trace, where: str) -> None:
    """Raise ``RunFolderError`` naming ``where`` (file:line) and the field when a trace is malformed."""
    fix = "the trace is damaged; correct or delete that line (the report then shows that sample without its timeline)"
    if not isinstance(trace, dict):
        raise RunFolderError(f"{where}: expected a JSON object (one traced sample per line); {fix}")
    missing = [name for name in ("task", "id", "config", "block_size", "pieces", "forwards") if name not in trace]
    if missing:
        raise RunFolderError(f"{where} lacks {', '.join(missing)}: {fix}")
    for name in ("task", "id", "config", "repeat", "sample", "block_size"):
        valid, what = FIELD_TYPES[name]
        if name in trace and not valid(trace[name]):
            raise RunFolderError(f"{where}: field '{name}' is {json.dumps(trace[name])[:40]}, it must be {what}; {fix}")
    pieces, forwards = trace["pieces"], trace["forwards"]
    if not (isinstance(pieces, dict) and all(isinstance(v, str) for v in pieces.values())):
        raise RunFolderError(f"{where}: field 'pieces' must map token ids to their text; {fix}")
    if not isinstance(forwards, list):
        raise RunFolderError(f"{where}: field 'forwards' must be a list of forwards; {fix}")
    for number, forward in enumerate(forwards, start=1):
        problem = forward_problem(forward, trace["block_size"])
        if problem is None and forward["n"] != number:
            problem = f"field 'n' is {forward['n']}, it must be {number} (forwards in order, numbered from 1)"
        if problem:
            raise RunFolderError(f"{where}: forward {number} {problem}; {fix}")


def read_traces(path: Path) -> list[dict]:
    """Every complete line of a traces file, each checked (``check_trace``); [] when there is no file. A
    last line cut short by a killed process is skipped, a bad line elsewhere is an error naming it. A sample
    traced twice (a run resumed after its trace was written, before its record) keeps its last trace."""
    traces = read_json_lines(path, check_trace, "the traces are damaged; delete that line (the report then "
                                                "shows that sample without its timeline)")
    return list({trace_key(trace): trace for trace in traces}.values())


def trace_key(trace: dict) -> tuple:
    """The ``metrics.sample_key`` of the sample record a trace belongs to."""
    return sample_key(trace)


def slot_reveals(trace: dict) -> dict[int, int]:
    """Output index -> the forward (n) that last revealed it, over forwards that are not voided by a
    rejected draft (a verify forward's block is void when it rejected one: the next block starts elsewhere)."""
    revealed: dict[int, int] = {}
    for forward in trace["forwards"]:
        if forward["kind"] == "verify" and forward.get("rejected_slot") is not None:
            continue
        for slot in forward["revealed"]:
            revealed[forward["start"] + slot] = forward["n"]
    return revealed


def trace_problems(trace: dict, record: dict) -> list[str]:
    """How a trace disagrees with its sample record ([] when it adds up): one forward per NFE; the
    committed tokens, in order, are the output; per forward, the tokens it revealed that the output kept
    (unverified) or the tokens it committed (verified) are the record's ``revealed_per_forward``; a
    verified sample's drafts judged and accepted are its ``drafted_per_block`` and ``accepted_per_block``,
    block by block, and it has a rejected slot where a block's draft was replaced."""
    forwards = trace["forwards"]
    problems = []
    if len(forwards) != record["nfe"]:
        problems.append(f"{len(forwards)} forwards traced, the record has nfe {record['nfe']}")
    committed = [t for f in forwards for t in f["committed"]]
    if committed != record.get("output_ids"):
        problems.append(f"the committed tokens ({len(committed)}) are not the record's output_ids "
                        f"({len(record.get('output_ids') or [])})")
    verified = any(f["kind"] == "verify" for f in forwards)
    if verified:
        per_forward = [len(f["committed"]) for f in forwards]
        judged = [f for f in forwards if f["kind"] == "verify" and f["drafted"]]
        blocks = [(d, a, r) for d, a, r in zip(*(record.get(name) or [] for name in
                                                  ("drafted_per_block", "accepted_per_block", "replaced_per_block")))
                  if d]
        traced = [(f["drafted"], f["accepted"], int(f.get("rejected_slot") is not None)) for f in judged]
        if traced != blocks:
            problems.append(f"drafts judged per block (drafted, accepted, replaced) {traced} are not the record's {blocks}")
    else:
        reveals = slot_reveals(trace)
        kept = [reveals.get(i) for i in range(len(record.get("output_ids") or []))]
        per_forward = [kept.count(f["n"]) for f in forwards]
    expected = list(record.get("revealed_per_forward") or [])
    expected += [0] * (len(forwards) - len(expected))  # NTP: forwards whose token a stop string cut keep none
    if per_forward != expected:
        problems.append(f"tokens per forward {per_forward} are not the record's revealed_per_forward "
                        f"{record.get('revealed_per_forward')}")
    return problems
