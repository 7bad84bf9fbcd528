"""The whole training step replayed as one CUDA graph: forward, loss, backward, GradScaler and
the fused optimizer's update, launched as a single graph instead of hundreds of kernels.

A small-batch step is bound by kernel launches, so without a graph the arms compare launch
overhead more than precision. torch.cuda.graphs rather than torch.compile(mode="reduce-overhead"):
no compilation at each arm's start, and the optimizer and scaler are captured too.

What a step reads from the host is drawn into static buffers (StepInputs); the learning rate is
a device tensor filled in place; every epoch drops its last partial batch, so every step has
the captured shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from ampbench.errors import AmpbenchError
from ampbench.world import World

CUDA_GRAPHS_OPTION = "--cuda-graphs"


@dataclass(frozen=True)
class StepInputs:
    """Everything a training step takes from outside the graph: which rows of the resident
    training set, and the random crop offsets (2 x batch) and flips (batch) drawn for them."""

    rows: torch.Tensor
    offsets: torch.Tensor
    flip: torch.Tensor

    def tensors(self) -> tuple[torch.Tensor, ...]:
        # Not dataclasses.astuple: it deep-copies, and the static buffers must be these.
        return tuple(getattr(self, field.name) for field in fields(self))


def settle_cuda_graphs(
    requested: bool, device: torch.device, world: World, warmup_steps: int, compile_model: bool
) -> tuple[bool, str]:
    """(whether the steps are replayed as a CUDA graph, in words why), settled before any
    data is read: on wherever it is asked for and applies (CUDA, one process)."""
    if not requested:
        return False, "off (--no-cuda-graphs)"
    if device.type != "cuda":
        return False, f"off: they need a CUDA device, not {device.type}"
    if world.distributed:
        return False, "off under torchrun: DDP's gradient all-reduce is not captured here"
    if warmup_steps == 0:
        raise AmpbenchError(
            f"--warmup-steps 0 with {CUDA_GRAPHS_OPTION}: the step is captured after the "
            "warm-up has chosen its kernels; give at least one warm-up step or --no-cuda-graphs"
        )
    return True, "on" + (", over the compiled model" if compile_model else "")


class StepRunner:
    """Runs the training step on its inputs: eagerly, or as a replay of the CUDA graph
    captured from the same step function. The inputs go through static buffers either way
    (made on the first call), so that eager and graph runs execute the same code."""

    def __init__(self, step: Callable[[StepInputs], None]) -> None:
        self.step = step
        self.static: StepInputs | None = None
        self.graph: torch.cuda.CUDAGraph | None = None

    def capture(self) -> None:
        """Record one step as a CUDA graph (nothing runs: the state is left as it is). The step
        must have run eagerly first, on a side stream: cuDNN's autotuning, the allocator's
        growth and lazy initialisation cannot happen inside a capture."""
        if self.static is None:
            raise RuntimeError("the step has not run before its capture")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.step(self.static)
        self.graph = graph

    def __call__(self, inputs: StepInputs) -> None:
        if self.static is None:
            self.static = StepInputs(*(tensor.clone() for tensor in inputs.tensors()))
        else:
            for static, given in zip(self.static.tensors(), inputs.tensors(), strict=True):
                static.copy_(given)
        if self.graph is None:
            self.step(self.static)
        else:
            self.graph.replay()
