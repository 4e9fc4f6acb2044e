"""Assisted decoding with a draft model (speculative decoding: Leviathan et al. 2023, Chen et al. 2023), as
transformers' ``generate(assistant_model=...)`` runs it: a smaller model with the same tokenizer drafts
``tokens`` tokens greedily (sampled at a temperature), one forward of the target verifies them all. Kept
to the textbook rule: a constant number of drafts (``num_assistant_tokens_schedule="constant"``) and no
early stop on the draft's confidence (``assistant_confidence_threshold=0``; HF's 0.4 default, adapted from
an ROC curve only where scikit-learn is installed, would make the drafts depend on the environment).
"""
from dataclasses import dataclass
from typing import ClassVar

from sbd_bench.types import GenerateBaseline, SolverError


@dataclass(frozen=True)
class HFAssisted(GenerateBaseline):
    name: ClassVar[str] = "hf_assisted"
    description: ClassVar[str] = "transformers' assisted decoding: a small draft model proposes, the model verifies"
    draft: str = "ntp-draft"  # a local HF folder, or a shipped model name (models/ntp-draft: 0.23M parameters)
    tokens: int = 5  # num_assistant_tokens: tokens drafted per target forward

    def __post_init__(self):
        if not self.draft.strip():
            raise SolverError("hf_assisted: draft must name a model folder or a shipped model (default: ntp-draft)")
        if self.tokens < 1:
            raise SolverError(f"hf_assisted: tokens must be >= 1 (got {self.tokens}); it is the number of tokens the "
                              f"draft model proposes per target forward (transformers' num_assistant_tokens)")

    @property
    def draft_model(self) -> str:
        return self.draft

    def generate_options(self) -> dict:
        return {"num_assistant_tokens": self.tokens, "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": 0.0}
