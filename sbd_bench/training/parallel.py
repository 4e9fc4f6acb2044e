"""How a training step is spread over processes: one process (``single``), or the ranks of a torchrun
worker group with FSDP2 (``fsdp``: each decoder layer, then the root, sharded over the ranks) or DDP
(``ddp``: a full replica per rank, gradients all-reduced). NCCL on CUDA, gloo on CPU.

    torchrun --nproc-per-node 8 -m sbd_bench train --base M --data d.jsonl --out ft     # fsdp, 8 GPUs

On CUDA the model computes in bf16 and keeps fp32 master weights, gradients and optimizer state:
FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, or bf16 autocast for ``single``
and ``ddp``. On the CPU everything is fp32. ``--activation-checkpointing`` recomputes each decoder
layer in the backward pass instead of keeping its activations (the layer's input is kept).
"""
from __future__ import annotations

import contextlib
import datetime
from dataclasses import dataclass

from .config import TrainConfig, TrainError, torchrun_world


@dataclass
class Parallel:
    strategy: str
    rank: int
    local_rank: int
    world: int
    device: object  # torch.device

    @property
    def main(self) -> bool:
        """Rank 0 prints, writes the log and exports; every rank writes its checkpoint shard."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()

    @property
    def precision(self) -> str:
        return "bf16 compute, fp32 weights/grads/optimizer" if self.device.type == "cuda" else "fp32"

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()

    def sum(self, values: list[float]) -> list[float]:
        """Each value summed over the ranks (one all-reduce)."""
        if not self.distributed:
            return list(values)
        import torch
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def gather(self, value: float) -> list[float]:
        """Every rank's ``value``, on every rank."""
        if not self.distributed:
            return [value]
        import torch.distributed as dist

        values = [None] * self.world
        dist.all_gather_object(values, value)
        return values

    def broadcast(self, obj):
        """Rank 0's Python object, on every rank."""
        if not self.distributed:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def leave(self) -> None:
        """Leave the process group once every rank is done: a barrier, then ``close``. gloo aborts a rank
        that destroys its group while another still works in it ('terminate called without an active
        exception': 4 runs in 12 of scripts/train_check.py, 1 in 10 two-rank trainings). The success path's
        exit; an error path only closes, without waiting for ranks that may be gone."""
        self.barrier()
        self.close()

    def close(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.destroy_process_group()


def check_launch(cfg: TrainConfig) -> None:
    """Strategy against launcher, before anything loads."""
    if cfg.strategy in ("fsdp", "ddp") and torchrun_world() is None:
        raise TrainError(f"--strategy {cfg.strategy} needs torchrun: torchrun --nproc-per-node N -m sbd_bench train "
                         f"...; one process trains with --strategy single (the default)")
    if cfg.lora_rank and cfg.strategy == "fsdp":
        raise TrainError("--lora-rank is for one GPU (or ddp): with FSDP, shard the full model instead "
                         "(leave --lora-rank out), or pass --strategy ddp")


def start(cfg: TrainConfig) -> Parallel:
    """Pick the device (cuda:LOCAL_RANK under torchrun) and join the process group."""
    import torch

    from ..core.model import pick_device

    launched = torchrun_world()
    rank, local_rank, world = launched or (0, 0, 1)
    if launched and cfg.device.startswith("cuda:"):
        raise TrainError(f"--device {cfg.device} under torchrun: use --device cuda or auto (rank r takes cuda:LOCAL_RANK)")
    device = pick_device(cfg.device)
    if device.type == "cuda" and launched:
        device = torch.device(f"cuda:{local_rank}")
        torch.cuda.set_device(device)
    par = Parallel(cfg.strategy, rank, local_rank, world, device)
    if cfg.strategy != "single":
        import torch.distributed as dist

        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(minutes=30),
                                device_id=device if device.type == "cuda" else None)
    return par


def decoder_layers(model) -> list:
    """The transformer blocks (transformers' checkpointable layers): FSDP's units."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise TrainError(f"{type(model).__name__} has no decoder layers that transformers can checkpoint: FSDP and "
                         f"--activation-checkpointing need a Llama/Qwen-style model")
    return layers


def wrap(model, cfg: TrainConfig, par: Parallel):
    """The model, on its device, as the strategy trains it."""
    import torch

    if cfg.activation_checkpointing:
        decoder_layers(model)
        # per decoder layer, non-reentrant: the recomputed forward is the same computation (same loss and grads)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if par.strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(par.device.type, (par.world,))
        policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                  if par.device.type == "cuda" else MixedPrecisionPolicy())
        full = model.state_dict() if par.main else {}  # rank 0's weights (the others may hold shapes only)
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        model = _materialise(model, par)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        _broadcast_buffers(model)
        return model
    model = _materialise(model, par) if par.strategy == "ddp" else model.to(par.device)
    if par.strategy == "ddp":  # DDP's constructor copies rank 0's parameters and buffers to every rank
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[par.local_rank] if par.device.type == "cuda" else None,
                                       gradient_as_bucket_view=True)  # no second copy of the gradients
    return model


def _materialise(model, par):
    """A model built on the meta device (shapes only: ranks > 0) gets real, uninitialised storage on
    the rank's device; rank 0's values are copied into it next."""
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        model = model.to_empty(device=par.device)
        if par.strategy != "fsdp" and hasattr(model, "tie_weights"):
            model.tie_weights()  # to_empty gives each module its own tensor: tie the embeddings again
        return model
    return model.to(par.device)


def _broadcast_buffers(model) -> None:
    """Buffers that are no part of the state dict (rotary frequencies): rank 0's, on every rank."""
    import torch.distributed as dist

    for buffer in model.buffers():
        dist.broadcast(buffer, src=0)


def unwrapped(model):
    """The transformers model inside a DDP wrapper (FSDP2 wraps in place)."""
    return getattr(model, "module", model)


def autocast(par: Parallel):
    """bf16 autocast where the strategy does not cast itself (FSDP2's policy does); none on the CPU."""
    import torch

    if par.device.type == "cuda" and par.strategy != "fsdp":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def mask_dtype(par: Parallel):
    """The dtype of the attention scores, which the additive mask must have (sdpa)."""
    import torch

    return torch.bfloat16 if par.device.type == "cuda" else torch.float32


def sync_gradients(model, par: Parallel, last: bool):
    """DDP all-reduces on the last micro-batch of a step only; FSDP reduce-scatters every micro-batch
    (keeping only the shard of the gradients between micro-batches is what saves its memory)."""
    if par.strategy == "ddp" and not last:
        return model.no_sync()
    return contextlib.nullcontext()


def grad_norm_and_clip(model, max_norm: float) -> float:
    """Clip to ``max_norm`` and return the total norm before clipping (over all ranks' shards)."""
    import torch

    norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], max_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
