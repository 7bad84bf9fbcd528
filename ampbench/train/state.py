"""Where the loop stands (LoopState, saved in each checkpoint), what its warm-up cost
(WarmUpRecord), and the per-step statistics it keeps on the device (DeviceCounters), which
tell whether the run has diverged."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from ampbench.logs import log
from ampbench.results import CompileCacheOutcome
from ampbench.train import distributed


@dataclass
class WarmUpRecord:
    """What the untimed warm-up cost (loop.py's protocol, step 3)."""

    seconds: float = 0.0
    compile_s: float = 0.0  # its first step, where a compiled model compiles
    compile_cache: CompileCacheOutcome | None = None  # with a shared compile cache


@dataclass
class LoopState:
    """Everything the loop needs to continue where it stopped; saved in each checkpoint."""

    epoch: int = 0
    step: int = 0  # next step within the epoch
    global_step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    train_time_s: float = 0.0  # completed epochs
    epoch_elapsed_s: float = 0.0  # the current epoch, up to the last checkpoint
    train_energy_j: float = 0.0  # this process's counter over the training clock (energy.py)
    eval_time_s: float = 0.0
    checkpoint_time_s: float = 0.0
    # --target-accuracy: the training time and epoch at which test accuracy first reached it
    target_time_s: float | None = None
    target_epoch: int | None = None

    def close_epoch(self, record: dict[str, Any], time_s: float, target_accuracy: float) -> None:
        """Count the finished epoch (its record and training time) and move to the next one;
        at --target-accuracy, mark the target reached."""
        self.history.append(record)
        self.train_time_s += time_s
        if target_accuracy and record["test_accuracy"] >= target_accuracy:
            # MLPerf's rule: stop at the first evaluation that reaches the target.
            self.target_time_s, self.target_epoch = self.train_time_s, self.epoch + 1
            log.info(
                "target accuracy %g reached after epoch %d: %.2f s of training; stop",
                target_accuracy,
                self.epoch + 1,
                self.train_time_s,
            )
        self.epoch += 1
        self.step = 0
        self.epoch_elapsed_s = 0.0


@dataclass
class DeviceCounters:
    """Per-step statistics of the current epoch, kept on the device so that the hot loop never
    waits for the host. Changed in place only: a captured CUDA graph holds their addresses."""

    loss_sum: torch.Tensor
    correct: torch.Tensor
    steps: torch.Tensor  # steps taken this epoch
    first_bad_step: torch.Tensor  # the epoch's first step with a non-finite loss, -1 if none
    skipped: torch.Tensor  # fp16 steps the GradScaler skipped, this epoch
    skip_streak: torch.Tensor
    longest_skip_streak: torch.Tensor
    # fp16: the loss scale each step of the epoch trained with, by step (preallocated: the
    # captured step writes into it, and it is read between epochs).
    loss_scales: torch.Tensor

    @classmethod
    def zeros(cls, device: torch.device, steps_per_epoch: int = 1) -> DeviceCounters:
        names = [field.name for field in dataclasses.fields(cls)][:-1]
        counters = cls(
            *(torch.zeros((), device=device, dtype=torch.float64) for _ in names),
            loss_scales=torch.zeros(max(1, steps_per_epoch), device=device, dtype=torch.float32),
        )
        counters.reset()
        return counters

    def reset(self) -> None:
        for tensor in self.state().values():
            tensor.zero_()
        self.first_bad_step.fill_(-1)

    def state(self) -> dict[str, torch.Tensor]:
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    def load(self, state: dict[str, torch.Tensor]) -> None:
        for name, tensor in self.state().items():
            tensor.copy_(state[name])

    def count_step(
        self,
        loss: torch.Tensor,
        logits: torch.Tensor,
        labels: torch.Tensor,
        scales: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> None:
        """Count a step, on the device (inside the captured graph): `scales` is the GradScaler's
        scale before and after the step (fp16), None without a scaler."""
        self.loss_sum += loss.detach().double() * len(labels)
        self.correct += (logits.argmax(dim=1) == labels).sum()
        if scales is not None:
            # A warm-up longer than an epoch writes its last steps into the last place.
            place = self.steps.long().clamp(max=len(self.loss_scales) - 1).reshape(1)
            self.loss_scales.index_copy_(0, place, scales[0].reshape(1).float())
            # The scaler lowers its scale exactly when it skipped the step (inf/NaN grads).
            skipped = (scales[1] < scales[0]).double().squeeze()
            self.skipped += skipped
            self.skip_streak.copy_((self.skip_streak + 1) * skipped)
            torch.maximum(self.longest_skip_streak, self.skip_streak, out=self.longest_skip_streak)
        else:
            first = (self.first_bad_step < 0) & ~torch.isfinite(loss.detach())
            self.first_bad_step.copy_(torch.where(first, self.steps, self.first_bad_step))
        self.steps += 1

    def worst_over_ranks(self) -> tuple[int, int]:
        """(the longest skip streak, the epoch's first step with a non-finite loss or -1), the
        worst over the ranks, so that every rank decides alike (one rank stopping alone would
        leave the others waiting). A host sync."""
        never = float(2**53)
        first_bad = torch.where(self.first_bad_step < 0, never, self.first_bad_step)
        streak_and_bad = torch.stack([self.longest_skip_streak, -first_bad])
        longest_streak, bad = distributed.all_reduce(streak_and_bad, "max").tolist()
        return int(longest_streak), -1 if -bad == never else int(-bad)
