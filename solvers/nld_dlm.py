"""Nemotron-Labs-Diffusion's own diffusion decoder (``NemotronLabsDiffusionModel.generate``, its ``dlm``
mode; arXiv 2607.05722), run as its code runs it, as a baseline beside our SBD decoding of the same weights:
each block's first slot is the next-token argmax of a causal forward (the prompt's, then each block's
*commit* forward, which writes the block's exact keys and values), the other ``block`` − 1 slots are
denoised bidirectionally, revealing every slot with confidence >= ``tau`` and the most confident one
always; the vendor counts the commit forwards (tokens per forward <= block / 2). Its defaults are the
vendor's evaluation defaults (block 8, tau 0.9). The loop: core/schedules.py; what differs from the
vendor's code (the mask token, stops, the last block): its docstring and docs/models.md."""
from dataclasses import dataclass
from typing import ClassVar

from sbd_bench.types import ScheduleBaseline, SolverError


@dataclass(frozen=True)
class NLDDiffusion(ScheduleBaseline):
    name: ClassVar[str] = "nld_dlm"
    description: ClassVar[str] = ("Nemotron-Labs-Diffusion's own diffusion schedule: AR seed, block-1 denoised "
                                  "slots (confidence >= tau), a counted causal commit forward")
    schedule: ClassVar[str] = "dlm"
    decoded_by: ClassVar[str] = "Nemotron-Labs-Diffusion's own diffusion schedule"
    block: int = 8  # slots per block, the seed included (the vendor's evaluation default; its chat script: 32)
    tau: float = 0.9

    def __post_init__(self):
        if self.block < 1:
            raise SolverError(f"nld_dlm: block must be >= 1 (got {self.block}); it is the slots of a block, the "
                              f"next-token seed included (the vendor evaluates with 8)")
        if not 0.0 < self.tau <= 1.0:
            raise SolverError(f"nld_dlm: tau must be in (0, 1] (got {self.tau}); a slot is revealed at confidence "
                              f">= tau, the most confident one always (the vendor's default 0.9)")

    def schedule_options(self) -> dict:
        return {"block": self.block, "tau": self.tau}
