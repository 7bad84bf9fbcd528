"""Data-parallel training under torchrun: the process group, the rank's share of each batch,
and the collectives the engine needs, all of which do nothing in a single process.

torchrun (or Kubeflow Trainer's torch runtime, which starts torchrun) sets RANK, LOCAL_RANK,
WORLD_SIZE and the rendezvous address; `ampbench train` then runs unchanged, one process per
GPU (NCCL) or per CPU share (gloo). `--batch-size` is each process's batch: the global batch
of a step is that times the world size, and every rank takes its own part of the global batch
that a single process would take, so that a run's samples and augmentation depend on
(seed, epoch, step) alone, not on how many processes share the work.
"""

from __future__ import annotations

import atexit
import datetime

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from ampbench.world import World

# Gradient all-reduce precision, an arm setting: DDP's built-in compression hooks cast each
# bucket to bf16 or fp16 for the all-reduce and back (fp32: no hook, DDP's default).
GRAD_COMM_HOOKS = {
    "fp32": None,
    "bf16": default_hooks.bf16_compress_hook,
    "fp16": default_hooks.fp16_compress_hook,
}
# How long a collective may wait for a rank that has gone: a killed rank must end the job
# (torchrun then stops the others) rather than leave them waiting for good.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)


def join(world: World, device: torch.device) -> None:
    """Join the process group (once per process): NCCL between GPUs, gloo between CPUs."""
    if not world.distributed or dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        rank=world.rank,
        world_size=world.size,
        timeout=COLLECTIVE_TIMEOUT,
        device_id=device if device.type == "cuda" else None,
    )
    atexit.register(leave)


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def backend() -> str | None:
    return dist.get_backend() if dist.is_initialized() else None


def wrap(model: nn.Module, device: torch.device, grad_comm: str) -> nn.Module:
    """The model under DistributedDataParallel, its gradient all-reduce in `grad_comm`
    precision; the model itself in a single process."""
    if not dist.is_initialized():
        return model
    ddp = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )
    hook = GRAD_COMM_HOOKS[grad_comm]
    if hook is not None:
        ddp.register_comm_hook(None, hook)
    return ddp


def barrier(device: torch.device) -> None:
    """Every rank here, and (on CUDA) its queued work done: what brackets a timed region."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if dist.is_initialized():
        dist.barrier()


REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """`tensor` reduced over the ranks (sum or max), in place."""
    if dist.is_initialized():
        dist.all_reduce(tensor, REDUCE_OPS[op])
    return tensor


def broadcast_float(value: float, device: torch.device) -> float:
    """Rank 0's `value` on every rank."""
    if not dist.is_initialized():
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.broadcast(tensor, src=0)
    return float(tensor.item())


def max_over_ranks(values: list[float], device: torch.device) -> list[float]:
    """Each of `values`, the largest any rank has (peak memory: the busiest rank's)."""
    if not dist.is_initialized():
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    return all_reduce(tensor, "max").tolist()


def broadcast_buffers(model: nn.Module) -> None:
    """Rank 0's buffers (BatchNorm's running statistics) on every rank: each rank updated
    them from its own part of the last batch, and evaluation must see one model."""
    if not dist.is_initialized():
        return
    for buffer in model.buffers():
        dist.broadcast(buffer, src=0)


def rank_slice(count: int, world: World) -> slice:
    """This rank's contiguous part of `count` items (the first ranks take one more when
    `count` does not divide): how evaluation shares a split."""
    share, extra = divmod(count, world.size)
    start = world.rank * share + min(world.rank, extra)
    return slice(start, start + share + (world.rank < extra))
