"""Nemotron-Labs-Diffusion's self-speculation (``linear_spec_generate``; arXiv 2607.05722), run as its code
runs it, as a baseline beside our verified decoding (``verify=on``) of the same weights, whose output it
shares (greedy: NTP's): a block [seed, mask x (block - 1)] is drafted in one bidirectional forward, verified
in one causal forward, the agreeing drafts and the argmax after them (the next seed) committed, the cache
cropped to them. Two forwards per block where ours fuses the verify of one block with the draft of the
next; the vendor counts the prompt's forward too. Without the vendor's LoRA drafter (a second set of
weights for the draft forwards). The loop: core/schedules.py; docs/models.md."""
from dataclasses import dataclass
from typing import ClassVar

from sbd_bench.types import ScheduleBaseline, SolverError


@dataclass(frozen=True)
class NLDSelfSpeculation(ScheduleBaseline):
    name: ClassVar[str] = "nld_spec"
    description: ClassVar[str] = ("Nemotron-Labs-Diffusion's own self-speculation: draft a block bidirectionally, "
                                  "verify it causally, keep the agreeing prefix and the bonus")
    schedule: ClassVar[str] = "linear_spec"
    decoded_by: ClassVar[str] = "Nemotron-Labs-Diffusion's own self-speculation"
    block: int = 32  # slots per block, the seed included (the vendor's default)

    def __post_init__(self):
        if self.block < 1:
            raise SolverError(f"nld_spec: block must be >= 1 (got {self.block}); it is the slots drafted per "
                              f"cycle, the seed included (the vendor's default 32)")

    def schedule_options(self) -> dict:
        return {"block": self.block}
