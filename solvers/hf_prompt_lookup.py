"""Prompt-lookup decoding (Saxena 2023), as transformers' ``generate(prompt_lookup_num_tokens=...)`` runs it:
the last ``ngram`` tokens (down to 1 when no longer n-gram matches) are looked up in the prompt and the
text generated so far; the ``tokens`` that followed their first match are drafted, and one forward of the
model verifies them all. No second model, no fine-tuning; greedy output is the model's own.
"""
from dataclasses import dataclass
from typing import ClassVar

from sbd_bench.types import GenerateBaseline, SolverError


@dataclass(frozen=True)
class HFPromptLookup(GenerateBaseline):
    name: ClassVar[str] = "hf_prompt_lookup"
    description: ClassVar[str] = "transformers' prompt-lookup decoding: drafts copied from the context after a matching n-gram"
    tokens: int = 10  # prompt_lookup_num_tokens: drafted tokens per forward at most
    ngram: int = 2  # max_matching_ngram_size: the longest n-gram looked up (HF's default)

    def __post_init__(self):
        if self.tokens < 1:
            raise SolverError(f"hf_prompt_lookup: tokens must be >= 1 (got {self.tokens}); it is the most tokens drafted "
                              f"per forward (transformers' prompt_lookup_num_tokens)")
        if self.ngram < 1:
            raise SolverError(f"hf_prompt_lookup: ngram must be >= 1 (got {self.ngram}); it is the longest n-gram "
                              f"looked up (transformers' max_matching_ngram_size)")

    def generate_options(self) -> dict:
        return {"prompt_lookup_num_tokens": self.tokens, "max_matching_ngram_size": self.ngram}
