"""A run folder with hand-written per-forward traces (docs/records.md, 'Traces'), so that the trace
reader and the report's decoding timeline are tested before the core writes traces.

One example of a `copy` task, "copy: abcdefghij" -> "abcdefghij." (11 tokens, '.' the stop), block
size 4, traced under four configurations: NTP (11 forwards), a block solver revealing 2 slots per
forward (6), a verified one whose first block's last draft NTP rejects (5), and a revoking one that
re-masks a slot it revealed (5). Two more examples are recorded without traces; on the last one the
block solver's output differs from NTP's.
"""
from __future__ import annotations

import json
from pathlib import Path

from measure_fixtures import crafted_record, crafted_run

BLOCK = 4
PIECES = {**{10 + i: c for i, c in enumerate("abcdefghij")}, 2: ".", 30: "x", 31: "q", 32: "z"}
IDS = {text: token for token, text in PIECES.items()}
OUTPUT = [IDS[c] for c in "abcdefghij."]
NTP, BLOCKS, VERIFIED, REVOKING = "ntp", "fixed_k:k=2", "fixed_k:k=4,verify=on", "remask:tau=0.5"
PARAMS = {NTP: {}, BLOCKS: {"k": 2}, VERIFIED: {"k": 4, "verify": "on"}, REVOKING: {"tau": 0.5}}


def ids(text: str) -> list[int]:
    return [IDS[c] for c in text]


def forward(n: int, kind: str, start: int, tokens: str, masked, revealed, committed: str = "", revoked=(),
            size: int = BLOCK, **verify) -> dict:
    """One forward as the core writes it. ``tokens``: the block after the forward, '_' where masked;
    entropy and confidence are made up, lower entropy for the slots revealed, null where not masked."""
    entropy = [None if s not in masked else round(0.05 + 0.3 * (s not in revealed) + 0.01 * s, 4) for s in range(size)]
    confidence = [None if e is None else round(1 - e / 2, 4) for e in entropy]
    return {"n": n, "kind": kind, "start": start, "size": size, "masked": list(masked), "revealed": list(revealed),
            "revoked": list(revoked), "tokens": [-1 if c == "_" else IDS[c] for c in tokens],
            "entropy": entropy, "confidence": confidence, "committed": ids(committed), **verify}


ALL = (0, 1, 2, 3)
FORWARDS = {
    NTP: [forward(i + 1, "ntp", i, c, [0], [0], c, size=1) for i, c in enumerate("abcdefghij.")],
    BLOCKS: [
        forward(1, "block", 0, "a__d", ALL, [0, 3]),
        forward(2, "block", 0, "abcd", [1, 2], [1, 2], "abcd"),
        forward(3, "block", 4, "ef__", ALL, [0, 1]),
        forward(4, "block", 4, "efgh", [2, 3], [2, 3], "efgh"),
        forward(5, "block", 8, "ij__", ALL, [0, 1]),
        forward(6, "block", 8, "ij.z", [2, 3], [2, 3], "ij."),  # 'z' falls after the stop: dropped
    ],
    VERIFIED: [
        # slot 0 of a verify forward's block is NTP's token, committed at once; the others are drafts
        forward(1, "verify", 0, "abcx", ALL, ALL, "a", drafted=0, accepted=0, rejected_slot=None),
        # NTP confirms b and c, replaces the draft x (slot 3) by d: this forward's block is void
        forward(2, "verify", 4, "qfgh", ALL, ALL, "bcd", drafted=3, accepted=2, rejected_slot=3),
        forward(3, "verify", 4, "efgh", ALL, ALL, "e", drafted=0, accepted=0, rejected_slot=None),
        forward(4, "verify", 8, "ij.z", ALL, ALL, "fghi", drafted=3, accepted=3, rejected_slot=None),
        # the final check: the drafts j and '.' (a stop) confirmed by one more forward, no block
        forward(5, "verify", 11, "", [], [], "j.", size=0, drafted=2, accepted=2, rejected_slot=None),
    ],
    REVOKING: [
        forward(1, "block", 0, "abq_", ALL, [0, 1, 2]),
        forward(2, "block", 0, "ab_d", [3], [3], revoked=[2]),  # q taken back
        forward(3, "block", 0, "abcd", [2], [2], "abcd"),
        forward(4, "block", 4, "efgh", ALL, ALL, "efgh"),
        forward(5, "block", 8, "ij.z", ALL, ALL, "ij."),
    ],
}
# what the records of the traced sample say: revealed_per_forward, forwards_per_block, and verified blocks
RECORDED = {
    NTP: {"revealed_per_forward": [1] * 11, "forwards_per_block": [4, 4, 3]},
    BLOCKS: {"revealed_per_forward": [2, 2, 2, 2, 2, 1], "forwards_per_block": [2, 2, 2]},
    VERIFIED: {"revealed_per_forward": [1, 3, 1, 4, 2], "forwards_per_block": [1, 1, 1, 1, 1],
               "drafted_per_block": [3, 0, 3, 2, 0], "accepted_per_block": [2, 0, 3, 2, 0],
               "replaced_per_block": [1, 0, 0, 0, 0]},
    REVOKING: {"revealed_per_forward": [2, 1, 1, 4, 3], "forwards_per_block": [3, 1, 1]},
}
# untraced examples: id -> (prompt, NTP's output, the block solver's)
UNTRACED = {"1": ("copy: ghij", "ghij.", "ghij."), "2": ("copy: bcdefa", "bcdefa.", "bcxefa.")}


def traced_records() -> list[dict]:
    records = []
    for config, forwards in FORWARDS.items():
        nfe = len(forwards)
        record = crafted_record(config, "copy", "0", nfe=nfe, tokens=len(OUTPUT), correct=True,
                                decode_time_s=0.002 * nfe, block_size=BLOCK)
        record.update(params=PARAMS[config], output_ids=OUTPUT, output_text="abcdefghij.",
                      prompt="copy: abcdefghij", answer="abcdefghij.", **RECORDED[config])
        records.append(record)
    for example, (prompt, ntp_text, block_text) in UNTRACED.items():
        for config in FORWARDS:
            text = block_text if config == BLOCKS else ntp_text
            nfe = len(text) if config == NTP else 2
            record = crafted_record(config, "copy", example, nfe=nfe, tokens=len(text), correct=text == ntp_text,
                                    decode_time_s=0.002 * nfe, block_size=BLOCK)
            record.update(params=PARAMS[config], output_ids=ids(text), output_text=text, prompt=prompt, answer=ntp_text)
            records.append(record)
    return records


def traces() -> list[dict]:
    """The traces of example 0, one per configuration."""
    return [{"task": "copy", "id": "0", "config": config, "repeat": 0, "block_size": BLOCK,
             "pieces": {str(t): PIECES[t] for t in sorted({t for f in forwards for t in f["tokens"] + f["committed"]
                                                           if t >= 0})},
             "forwards": forwards} for config, forwards in FORWARDS.items()]


def traced_run(path: Path) -> Path:
    """The run folder: records, summary and traces.jsonl."""
    crafted_run(path, traced_records())
    (path / "traces.jsonl").write_text("".join(json.dumps(t) + "\n" for t in traces()))
    return path
