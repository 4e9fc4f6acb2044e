"""The stop rule: where generation ends, shared by every decode mode (the core's loops, transformers'
generate, the families' schedules, aligned decoding), so that each stops where the others do.

    >>> rule = StopRule(lm.tokenizer, lm.stop_token_ids, stop_strings=(";",), max_new_tokens=64)
    >>> cut, reason = rule.stop_at(ids, len(ids), budget)   # (None, "") to go on; else keep ids[:cut]
    >>> rule.text(ids[:cut], reason)                         # the answer, without a stop string

A stop token ends the output after it; a stop string ends it at the fewest tokens whose text holds it
(the string itself is left out of the text); the budget ends it at ``budget`` tokens (``max_new_tokens``,
or ``context`` where the model's context is shorter). docs/decoding.md, 'Stops inside a block'.
"""
from __future__ import annotations


class StopRule:
    def __init__(self, tokenizer, stop_token_ids, stop_strings: tuple[str, ...] = (), max_new_tokens: int = 256):
        self.tokenizer, self.stop_token_ids, self.max_new_tokens = tokenizer, stop_token_ids, max_new_tokens
        self.stop_strings = tuple(s for s in stop_strings if s)

    def stop_at(self, ids: list[int], n_filled: int, budget: int, block_done: bool = False,
                first_new: int = 0) -> tuple[int | None, str]:
        """Where generation ends, given ``ids`` = everything generated whose predecessors are all
        revealed, ``n_filled`` of the output's positions filled, ``ids[:first_new]`` searched already.
        Returns (cut, reason): keep ids[:cut]; (None, '') to go on; ``block_done``: a block ends here."""
        cut, reason = None, ""
        stops = self.stop_token_ids
        for i in range(first_new, min(len(ids), budget)):
            if ids[i] in stops:
                cut, reason = i + 1, "stop_token"
                break
        if self.stop_strings:
            head = ids[: cut if cut is not None else budget]
            # a stop string ending before first_new was seen already: decode only a tail window
            # wide enough for any stop string ending anew, even at one byte-level token per UTF-8 byte
            window = 4 * max(len(s) for s in self.stop_strings) + 8
            tail = self.tokenizer.decode(head[max(0, first_new - window):], skip_special_tokens=True)
            if any(s in tail for s in self.stop_strings):
                cut, reason = self._stop_string_cut(head), "stop_string"
        if cut is not None:
            return cut, reason
        if n_filled >= budget:
            reason = "max_new_tokens" if budget == self.max_new_tokens else "context"
            return budget, reason
        if block_done:
            return n_filled, "block_done"
        return None, ""

    def _stop_string_cut(self, ids: list[int]) -> int:
        """The fewest tokens whose text already holds a stop string."""
        lo, hi = 1, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            text = self.tokenizer.decode(ids[:mid], skip_special_tokens=True)
            if any(s in text for s in self.stop_strings):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def text(self, ids: list[int], reason: str) -> str:
        """The output's text; after a stop string, the text before it."""
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if reason == "stop_string":  # the stop string itself is not part of the answer
            cut = min((text.find(s) for s in self.stop_strings if s in text), default=len(text))
            text = text[:cut]
        return text
