"""The NTP baseline: true next-token decoding, one token per forward, through the causal stream
and the same exact cache as every block solver (SBD.md §4)."""
from dataclasses import dataclass
from typing import ClassVar

from sbd_bench.types import BlockView, Solver


@dataclass(frozen=True)
class NTP(Solver):
    name: ClassVar[str] = "ntp"
    description: ClassVar[str] = "next-token baseline: causal stream, one token per forward"
    decodes_blocks: ClassVar[bool] = False

    def select(self, view: BlockView):
        raise RuntimeError("ntp decodes through the causal stream; the core never asks it to select")
