"""The core's bounds and checks: the errors it raises, the bound of a block's forwards, the finite check
of a model's logits, and the solver contract (types.Solver.select) checked at every decision.

    >>> check_max_block_forwards(block_size=16, max_block_forwards=8)   # DecodeError: at least 16
    >>> check_logits(lm, logits, "on the run's first prompt")           # BrokenModelError on NaN or +inf

During a decode the finite check costs no read of its own: ``Decoder.forward`` leaves a (B, 1) flag in the
call's ``ForwardLog``, read back with the forward's tokens (``state.to_host``), and ``check_finite`` stops
the decode at that forward. The solver's answer is checked twice: its shapes and types on the device side
(``check_decision``), what it revealed and masked again on the host, after the forward's one read
(``check_reveal``).
"""
from __future__ import annotations

import torch

from ..types import Solver, UsageError
from .model import LoadedModel


class DecodeError(UsageError):
    """A prompt or setting the core cannot decode; the message says what to change."""


class SolverContractError(RuntimeError):
    """A solver returned a reveal set that breaks the contract in types.Solver.select."""


class BrokenModelError(DecodeError):
    """The model's logits hold NaN or +inf: every solver's choice over them is garbage, none is to blame."""


class NonFiniteLogits(Exception):
    """A forward's logits read back as not finite for a row with work; ``generate_batch`` names the model."""


def check_max_block_forwards(block_size: int, max_block_forwards: int | None) -> None:
    """The bound of a block's forwards (None: the default, 2 x block size) leaves a block its k forwards."""
    if max_block_forwards is not None and max_block_forwards < block_size:
        raise DecodeError(f"--max-block-forwards must be at least the block size {block_size} (got {max_block_forwards}): "
                          f"every solver reveals at least one position per forward, so {block_size} forwards finish a "
                          f"block unless it revokes; the bound is for solvers that revoke")


def check_logits(lm: LoadedModel, logits: torch.Tensor, where: str) -> None:
    """Raise ``BrokenModelError`` when ``logits`` hold NaN or +inf (-inf is a masked token). A device read:
    called once before a run decodes, and where a solver seems to have broken its contract. During a
    decode the same test rides on each forward's one read (``finite_flag``, ``check_finite``)."""
    if bool((logits.isnan() | logits.isposinf()).any()):
        raise broken_model(lm, where)


def broken_model(lm: LoadedModel, where: str) -> BrokenModelError:
    dtype = str(lm.dtype).removeprefix("torch.")
    hint = "" if lm.dtype == torch.float32 else f"--dtype float32 if {dtype} overflows, or "
    return BrokenModelError(f"the model {lm.path} computes NaN or infinite logits ({where}) in {dtype}: it cannot "
                            f"decode; use {hint}weights saved before its training diverged")


def finite_flag(logits: torch.Tensor) -> torch.Tensor:
    """(B, 1) whether each row's logits (B, q, V) are free of NaN and +inf, on the device: one reduction, read
    back with the tokens chosen from them, so a model that breaks mid-run (bf16 overflow on a long context)
    stops the decode at that forward for no read of its own."""
    largest = _FLOAT32_MAX if logits.dtype == torch.float32 else torch.finfo(logits.dtype).max
    return logits.flatten(1).amax(1, keepdim=True) <= largest


_FLOAT32_MAX = torch.finfo(torch.float32).max  # the dtype of the core's logits (Decoder.forward)


def check_finite(rows: list, finite: list[list[bool]]) -> None:
    """Stop at a forward whose logits were NaN or +inf for a row still decoding (``finite_flag`` read back)."""
    if not all(ok[0] or r.stop_reason for r, ok in zip(rows, finite)):
        raise NonFiniteLogits


def check_decision(solver: Solver, picked, dropped, kept, masked: torch.Tensor) -> None:
    """The shapes and types of a solver's answer (what it may reveal or drop is checked in ``check_reveal``)."""
    if picked is None:
        raise SolverContractError(f"solver '{solver.name}': select returned None; it must return a bool tensor "
                                  f"shaped like view.masked {tuple(masked.shape)} (or a Decision holding one): "
                                  f"is a return statement missing?")
    for what, value in (("select", picked), ("Decision.remask", dropped)):
        if value is not None and (not isinstance(value, torch.Tensor) or value.dtype != torch.bool
                                  or value.shape != masked.shape):
            got = f"{value.dtype} {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
            raise SolverContractError(f"solver '{solver.name}': {what} returned {got}; it must be a bool tensor "
                                      f"shaped like view.masked {tuple(masked.shape)}")
    if dropped is not None and not solver.revokes:
        raise SolverContractError(f"solver '{solver.name}' returned Decision.remask without revokes = True: a "
                                  f"solver that masks positions again says so with the class flag")
    if kept is not None and (not isinstance(kept, torch.Tensor) or kept.shape[:2] != masked.shape):
        raise SolverContractError(f"solver '{solver.name}': Decision.state must be a tensor shaped (B, k, ...) "
                                  f"like view.masked {tuple(masked.shape)} first")


def check_reveal(name: str, picked: list[bool], dropped, reveal_step: list[int], fixed: int) -> None:
    """One row's choice on the host against its block: a reveal only of masked slots, at least one, and a
    remask (``dropped``, or None) only of slots the solver revealed in an earlier forward of this block
    (``reveal_step`` -1: masked; the first ``fixed`` slots are the core's)."""
    if any(c and s != -1 for c, s in zip(picked, reveal_step)):
        raise SolverContractError(f"solver '{name}' revealed a position that was already revealed")
    if not any(picked):
        raise SolverContractError(f"solver '{name}' revealed nothing in a forward; reveal at least one position")
    if dropped is not None and any(d and (s < 0 or i < fixed or c)
                                   for i, (d, s, c) in enumerate(zip(dropped, reveal_step, picked))):
        raise SolverContractError(f"solver '{name}' masked again a position it had not revealed in an earlier "
                                  f"forward of this block; remask only positions where view.revealed")
