"""Traces (``generate_batch(..., trace=True)``, docs/records.md, 'traces.jsonl'): one entry per forward a row
works in (what was masked, revealed, masked again, the tokens after it, the proxies at the masked slots, what
was committed, what verify judged). Tracing costs one more device read per forward (``proxies``), and
nothing when off: every step asks ``call.tracing`` first.

    >>> proxies = block_proxies(logits)             # (B, w, 2) on the host
    >>> add_forward(row, n, "block", start, masked, revealed, revoked, tokens, proxies[b], mask_id)
    >>> finish_traces(rows, tokenizer)              # the committed tokens and the text of every token
"""
from __future__ import annotations

import torch

from ..types import BlockView


def block_proxies(logits: torch.Tensor) -> list:
    """(B, w, 2) entropy and confidence of each slot's untempered distribution, as solvers see them, on the
    host: a trace's one extra device read per forward."""
    view = BlockView(logits, torch.ones(logits.shape[:2], dtype=torch.bool, device=logits.device))
    return torch.stack([view.entropy, view.confidence], dim=-1).tolist()


def add_forward(r, n: int, kind: str, start: int, masked: list[int], revealed: list[int], revoked: list[int],
                tokens: list[int], proxies: list, mask_id: int) -> None:
    """Forward ``n`` of row ``r``: the slots masked when it ran, those it revealed and masked again, the
    block's tokens after it, the proxies (entropy, confidence) at the masked slots."""
    at = set(masked)
    r.trace.append({
        "n": n, "kind": kind, "start": start, "size": len(tokens), "masked": masked,
        "revealed": revealed, "revoked": revoked, "tokens": [-1 if t == mask_id else t for t in tokens],
        "entropy": [round(e, 4) if i in at else None for i, (e, _) in enumerate(proxies[: len(tokens)])],
        "confidence": [round(c, 4) if i in at else None for i, (_, c) in enumerate(proxies[: len(tokens)])],
    })


def add_verdict(r, n: int, added: int, accepted: int, replaced: bool) -> None:
    """What verify judged at forward ``n`` of row ``r`` (a verify entry, added if the forward opened no block
    for the row to draft): the tokens committed, the drafts judged and accepted, the slot rejected."""
    if not r.trace or r.trace[-1]["n"] != n:
        r.trace.append({"n": n, "kind": "verify", "start": r.block_start, "size": 0, "masked": [],
                        "revealed": [], "revoked": [], "tokens": [], "entropy": [], "confidence": []})
    r.trace[-1].update(start=r.block_start, added=added, drafted=len(r.pending) - 1, accepted=accepted,
                       rejected_slot=accepted + 1 if replaced and accepted < len(r.pending) - 1 else None)


def finish_traces(rows: list, tokenizer) -> None:
    """The tokens each forward added to the output (``committed``: an NTP forward its token, a block's last
    forward the block's tokens, a verify forward the accepted drafts and NTP's token; joined in order they
    are the output, a stop's cut included), and the text of every token id in the trace."""
    for r in rows:
        at = 0
        for entry in r.trace:
            added = entry.pop("added", 0)
            entry["committed"], at = r.out[at : at + added], at + added
    ids = {t for r in rows for entry in r.trace for t in entry["tokens"] if t >= 0}
    pieces = {str(i): tokenizer.decode([i]) for i in sorted(ids)}
    for r in rows:
        r.trace = {"pieces": {str(i): pieces[str(i)] for i in sorted({t for e in r.trace for t in e["tokens"]
                                                                      if t >= 0})},
                   "forwards": r.trace}
