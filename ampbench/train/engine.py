"""The training engine: one arm (a precision) trained and measured, as plainly as possible.

The measurement protocol, the same for every entry point (the pipeline's train step,
`ampbench train`, the benchmarks), is here and nowhere else:
1. The precision is resolved against the device before any data is read (precision.py).
2. The process's memory is read before the data upload (the total's baseline), the data set
   and the model are put on the device, and memory is read again (what is resident before the
   first step).
3. An untimed warm-up of `warmup_steps` real training steps pays the one-time costs - CUDA's
   lazy module loading, cuDNN autotuning, the allocator's growth, torch.compile - and is then
   undone (model, optimizer, scaler, counters and RNG put back), so the trajectory is the one
   an unwarmed run would take. On CUDA the step is then captured as one CUDA graph (graphs.py)
   and every timed step replays it.
4. The clock runs over the training steps only, device-synchronised; evaluation and checkpoint
   writes are timed apart, and whoever tracks the run (MLflow) does its work between epochs,
   never while steps are timed.
What each figure means is written once, in ampbench/results.py (DEFINITIONS and the schema).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ampbench.dataset_format import SplitTensors, read_metadata, read_split
from ampbench.errors import AmpbenchError
from ampbench.logs import Progress, log
from ampbench.process import StartupClock
from ampbench.results import (
    RESULTS_SCHEMA_VERSION,
    ArmResults,
    Compute,
    DatasetRecord,
    Distributed,
    EpochRecord,
    Memory,
    TimeToTarget,
    Timing,
)
from ampbench.sampling import stratified_take
from ampbench.train import checkpoint, distributed
from ampbench.train.config import TrainConfig, check_against_dataset
from ampbench.train.data import (
    DeviceSplit,
    draw_crop_flip,
    epoch_order,
    step_generator,
)
from ampbench.train.device import (
    device_record,
    pick_device,
    seed_everything,
    software_versions,
    sync,
)
from ampbench.train.flops import flop_counter_mode, peak_tflops, train_step_flops
from ampbench.train.fp8 import convert_for_fp8
from ampbench.train.graphs import StepInputs, StepRunner, settle_cuda_graphs
from ampbench.train.memory import MemoryMeter
from ampbench.train.models import build_model, parameter_count
from ampbench.train.optim import OneCycle, build_optimizer
from ampbench.train.precision import Precision, math_mode, resolve
from ampbench.train.state import DeviceCounters, LoopState
from ampbench.world import SINGLE_PROCESS, World, world_from_env

__all__ = [
    "MemoryMeter",
    "OneCycle",
    "Trainer",
    "build_optimizer",
    "pick_device",
    "seed_everything",
    "train",
]

HEALTH_CHECK_EVERY = 50  # steps between the (only) host syncs inside an epoch


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: DeviceSplit,
    precision: Precision,
    batch_size: int,
    world: World = SINGLE_PROCESS,
) -> tuple[float, float]:
    """(mean loss, accuracy) on a split, under the arm's autocast, with one host sync; under
    torchrun each rank evaluates its share and the sums are all-reduced."""
    model.eval()
    loss_sum = torch.zeros((), device=data.device, dtype=torch.float64)
    correct = torch.zeros((), device=data.device, dtype=torch.float64)
    for images, labels in data.eval_batches(batch_size, distributed.rank_slice(len(data), world)):
        with precision.autocast():
            logits = model(images)
        loss_sum += nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
        correct += (logits.argmax(dim=1) == labels).sum()
    model.train()
    totals = distributed.all_reduce(torch.stack([loss_sum, correct])).tolist()
    return totals[0] / len(data), totals[1] / len(data)


def _subset(split: SplitTensors, count: int, seed: int) -> SplitTensors:
    if not count or count >= len(split):
        return split
    rows = torch.from_numpy(
        stratified_take(split.labels.numpy(), count, np.random.default_rng(seed))
    )
    return SplitTensors(split.images[rows], split.labels[rows], split.indices[rows])


def _host_copy(value: Any) -> Any:
    """A deep copy with every tensor on the host (a state dict holds references to live ones)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _host_copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_host_copy(item) for item in value)
    return value


class Trainer:
    def __init__(
        self, config: TrainConfig, on_epoch: Callable[[EpochRecord], None] | None = None
    ) -> None:
        config.validate()
        self.config = config
        self.on_epoch = on_epoch
        self.world = world_from_env()
        self.device = pick_device(
            config.device, self.world.local_rank if self.world.distributed else None
        )
        distributed.join(self.world, self.device)
        self.device_record = device_record(self.device)
        # Settle the precision first: an impossible one fails before any data is read.
        self.precision = resolve(config.precision, self.device, config.allow_emulated)
        log.info("precision: %s (%s)", self.precision.label, self.precision.support)
        self.cuda_graphs, graphs_state = settle_cuda_graphs(
            config.cuda_graphs, self.device, self.world, config.warmup_steps, config.compile
        )
        log.info("CUDA graphs: %s", graphs_state)
        seed_everything(config.seed, config.deterministic)
        self.memory = MemoryMeter(self.device)
        self.memory.start()
        self.startup = StartupClock()  # imports done, the device initialised
        self.metadata = read_metadata(Path(config.dataset_dir))
        try:
            check_against_dataset(
                self.metadata,
                batch_size=config.batch_size,
                model=config.model,
                subset=config.subset,
                image_size=config.image_size,
                processes=self.world.size,
            )
        except AmpbenchError as error:
            raise AmpbenchError(f"{config.dataset_dir}: {error}") from None
        mean, std = self.metadata["mean"], self.metadata["std"]
        train_split = _subset(
            read_split(Path(config.dataset_dir), "train"), config.subset, config.seed
        )
        self.train_data = DeviceSplit(train_split, self.device, mean, std, config.image_size)
        self.eval_data = {
            split: DeviceSplit(
                _subset(read_split(Path(config.dataset_dir), split), config.subset, config.seed),
                self.device,
                mean,
                std,
                config.image_size,
            )
            for split in ("val", "test")
            if split in self.metadata["counts"]
        }
        # --batch-size is each process's; a step trains on the global batch.
        self.global_batch = config.batch_size * self.world.size
        self.eval_batch_size = config.eval_batch_size or config.batch_size
        self.steps_per_epoch = len(self.train_data) // self.global_batch
        self.model = build_model(
            config.model, len(self.metadata["classes"]), self.train_data.image_shape
        ).to(self.device, memory_format=torch.channels_last)
        if self.precision.fp8_recipe is not None:
            # Before the optimizer is made: torchao swaps nn.Linear for Float8Linear in place,
            # keeping the parameter objects.
            converted = convert_for_fp8(
                self.model,
                self.precision.fp8_recipe,
                self.precision.emulated,
                model_name=config.model,
            )
            log.info("fp8: %d Linear layers converted (%s)", converted, self.precision.fp8_recipe)
        # On CUDA the fused kernel takes the GradScaler's inf check on the device; any other
        # optimizer makes scaler.step() wait for the host on every fp16 step.
        # float32: the fused CUDA kernel reads a tensor learning rate as a float.
        self.lr = torch.zeros((), device=self.device, dtype=torch.float32)
        self.optimizer = build_optimizer(
            self.model, config, self.lr, fused=self.device.type == "cuda"
        )
        self.schedule = OneCycle(self.steps_per_epoch * config.epochs, config.warmup_fraction)
        self.scaler = torch.amp.GradScaler(
            self.device.type,
            init_scale=config.initial_loss_scale,
            enabled=self.precision.grad_scaler,
        )
        self.criterion = nn.CrossEntropyLoss(label_smoothing=config.label_smoothing)
        self.state = LoopState()
        self.counters = DeviceCounters.zeros(self.device)
        # run() makes it anew around the model it trains (DDP-wrapped, compiled).
        self.run_step = StepRunner(lambda inputs: self.train_step(self.model, inputs))
        self.resumed_from: str | None = None
        self.warmup_s = 0.0
        self.compile_s = 0.0
        self.flops_per_step: int | None = None
        self.startup.state_ready()  # last in __init__: the warm-up can start

    # -- state: checkpoints and the warm-up's undo -------------------------------------------
    def training_state(self) -> dict[str, Any]:
        """Everything a training step changes (references to the live tensors)."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": checkpoint.rng_states(),
            "counters": self.counters.state(),
        }

    def load_training_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:  # the loaded group holds a copy of the rate
            self.lr.copy_(torch.as_tensor(group["lr"]))
            group["lr"] = self.lr
        self.scaler.load_state_dict(state["scaler"])
        checkpoint.restore_rng_states(state["rng"])
        self.counters.load(state["counters"])

    def hyperparameters(self) -> dict[str, Any]:
        """The config's, with whether this device replayed the steps as a CUDA graph."""
        return {**self.config.hyperparameters(), "cuda_graphs": self.cuda_graphs}

    def fingerprint(self) -> dict[str, Any]:
        """What must match for a checkpoint to continue this run (not how it is measured)."""
        measurement_only = {"compile", "warmup_steps", "cuda_graphs", "eval_batch_size"}
        return {
            "dataset_sha256": self.metadata["source"]["sha256"],
            "dataset_counts": self.metadata["counts"],
            "precision": self.precision.name,
            "world_size": self.world.size,
            **{k: v for k, v in self.config.hyperparameters().items() if k not in measurement_only},
        }

    def save_checkpoint(self) -> None:
        assert self.config.checkpoint_dir is not None
        # The epoch's running sums are each rank's own: the checkpoint holds their total,
        # which rank 0 takes back on resume while the others start from zero.
        sums = distributed.all_reduce(torch.stack([self.counters.loss_sum, self.counters.correct]))
        if not self.world.main:  # every rank holds the same state otherwise; rank 0 writes it
            return
        started = time.perf_counter()
        training = self.training_state()
        training["counters"] = {**training["counters"], "loss_sum": sums[0], "correct": sums[1]}
        state = {"fingerprint": self.fingerprint(), "loop": asdict(self.state), **training}
        try:
            location = checkpoint.save(
                self.config.checkpoint_dir,
                self.state.global_step,
                state,
                self.config.keep_checkpoints,
            )
            log.debug("checkpoint %s", location)
        except AmpbenchError as error:
            # A checkpoint insures the run; losing one must not end it. A retry would resume
            # from the one before.
            log.warning(
                "checkpoint at step %d not saved (%s); training goes on",
                self.state.global_step,
                error,
            )
        self.state.checkpoint_time_s += time.perf_counter() - started

    def restore_checkpoint(self) -> None:
        assert self.config.checkpoint_dir is not None
        found = checkpoint.load_latest(self.config.checkpoint_dir)
        if found is None:
            log.info("resume: no checkpoint in %s yet; starting fresh", self.config.checkpoint_dir)
            return
        state, location = found
        if state["fingerprint"] != self.fingerprint():
            raise AmpbenchError(
                f"{location}: checkpoint belongs to a different run (dataset, precision or "
                "hyperparameters differ); use another --checkpoint-dir"
            )
        self.load_training_state(state)
        if not self.world.main:  # rank 0 holds the sums of every rank's steps so far
            self.counters.loss_sum.zero_()
            self.counters.correct.zero_()
        self.state = LoopState(**state["loop"])
        self.resumed_from = location
        log.info("resume: %s (epoch %d, step %d)", location, self.state.epoch + 1, self.state.step)

    # -- the loop ----------------------------------------------------------------------------
    def check_health(self) -> None:
        """The loop's only mid-epoch host sync: stop a run that has diverged."""
        counters = self.counters
        # Every rank decides alike (one rank stopping alone would leave the others waiting):
        # the longest skip streak and the earliest bad step over the ranks.
        never = float(2**53)
        first_bad = torch.where(counters.first_bad_step < 0, never, counters.first_bad_step)
        streak_and_bad = torch.stack([counters.longest_skip_streak, -first_bad])
        longest_streak, bad = distributed.all_reduce(streak_and_bad, "max").tolist()
        bad = -1 if -bad == never else self.state.epoch * self.steps_per_epoch + int(-bad)
        if self.precision.grad_scaler:
            streak = int(longest_streak)
            if streak >= self.config.max_skipped_steps:
                raise AmpbenchError(
                    f"fp16: the GradScaler skipped {streak} steps in a row (loss scale "
                    f"{self.scaler.get_scale():g}): gradients overflow on every step; "
                    "lower --lr or use bf16"
                )
            return
        if bad >= 0:
            raise AmpbenchError(
                f"training diverged: the loss became NaN or inf at step {bad} (epoch "
                f"{bad // self.steps_per_epoch + 1}, {self.precision.name}); lower --lr"
            )

    def count_flops(self) -> None:
        """The FLOPs of one training step, counted once on the eager model (flops.py); the
        caller puts the training state back (the step moves BatchNorm's running stats)."""
        rows = torch.arange(self.config.batch_size, device=self.device)
        offsets, flip = draw_crop_flip(
            len(rows), step_generator(self.device, self.config.seed, 0, 0)
        )
        images, labels = self.train_data.train_batch(rows, offsets, flip)
        self.record_flops(
            train_step_flops(self.model, images, labels, self.criterion, self.precision.autocast())
        )

    def record_flops(self, rank_flops: int) -> None:
        # One rank's share of the step, times the ranks: the global step's FLOPs.
        self.flops_per_step = self.world.size * int(rank_flops)
        log.info("FLOPs per training step: %.4g (forward and backward)", self.flops_per_step)

    def compute_record(self, steps: int) -> Compute | None:
        """DEFINITIONS["Achieved TFLOP/s"] and ["MFU"] for the steps trained."""
        if self.flops_per_step is None or not self.state.train_time_s > 0:
            return None
        achieved = self.flops_per_step * steps / self.state.train_time_s / 1e12
        peak = peak_tflops(self.device.type, self.device_record.name, self.precision.name)
        if peak is not None:
            peak *= self.world.size  # one device per process
        return Compute(self.flops_per_step, achieved, peak, achieved / peak if peak else None)

    def warm_up(self, model: nn.Module) -> None:
        """Untimed real training steps that pay the one-time costs, then undone (step 3 of
        the protocol in the module docstring); the FLOPs of a step are counted here too, and
        the step is captured as a CUDA graph where it is replayed."""
        steps = self.config.warmup_steps
        if self.state.epoch >= self.config.epochs:  # nothing left to time
            return
        saved = _host_copy(self.training_state())
        # FLOPs are counted on the eager model of one process: in the first warm-up step
        # where that is what trains (one step less per arm), else in a step of their own.
        counted_in_warm_up = steps > 0 and model is self.model
        if not counted_in_warm_up:
            self.count_flops()
        if steps == 0:  # no graph either: settle_cuda_graphs asks for a warm-up step
            self.load_training_state(saved)
            return
        epoch = self.state.epoch
        order = epoch_order(len(self.train_data), self.config.seed, epoch, self.device)
        started = time.perf_counter()
        # A step to be captured warms up on a side stream, as torch.cuda.graphs asks.
        stream = torch.cuda.Stream(self.device) if self.cuda_graphs else None
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(self.device))
        with (
            Progress(steps, f"warm-up {self.precision.name}", unit="step") as progress,
            torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext(),
        ):
            for warm_step in range(steps):
                inputs = self.step_inputs(order, epoch, warm_step % self.steps_per_epoch)
                global_step = self.state.global_step + warm_step
                if warm_step == 0 and counted_in_warm_up:
                    with flop_counter_mode() as counter:
                        self.take_step(inputs, global_step)
                    self.record_flops(counter.get_total_flops())
                else:
                    self.take_step(inputs, global_step)
                progress.update()
                if warm_step == 0 and self.config.compile:
                    sync(self.device)
                    self.compile_s = time.perf_counter() - started
        if stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(stream)
        sync(self.device)
        self.load_training_state(saved)
        if self.cuda_graphs:
            self.capture()
        self.warmup_s = time.perf_counter() - started
        log.info(
            "warm-up: %d steps%s in %.1f s%s, undone; not counted in training time",
            steps,
            " and the CUDA graph's capture" if self.cuda_graphs else "",
            self.warmup_s,
            f" (compilation {self.compile_s:.1f} s)" if self.config.compile else "",
        )

    def capture(self) -> None:
        """Record the training step as a CUDA graph (graphs.py); its memory, allocated now
        and reused by every replay, counts in every training window's peak."""
        self.optimizer.zero_grad(set_to_none=True)  # the gradients live in the graph's pool
        # The warm-up's cached blocks (cuDNN's autotuning scratch among them) would count in
        # the reserved peak held for every replay.
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        self.memory.skip_window()
        try:
            self.run_step.capture()
        except RuntimeError as error:
            detail = str(error).strip().splitlines()[0] if str(error).strip() else "no detail"
            raise AmpbenchError(
                f"--cuda-graphs: the training step of {self.config.model} in "
                f"{self.precision.name} cannot be captured as a CUDA graph ({detail}); "
                "train it with --no-cuda-graphs"
            ) from None
        self.memory.hold_step_peak()

    def step_rows(self, order: torch.Tensor, step: int) -> torch.Tensor:
        """This rank's part of the step's global batch: the rows one process would train on
        with a batch of global_batch, split among the ranks in rank order."""
        start = step * self.global_batch + self.world.rank * self.config.batch_size
        return order[start : start + self.config.batch_size]

    def step_inputs(self, order: torch.Tensor, epoch: int, step: int) -> StepInputs:
        """What a step takes from outside the graph: its rows of the epoch's order, and the
        crops and flips drawn from the step's own random stream."""
        rows = self.step_rows(order, step)
        offsets, flip = draw_crop_flip(
            len(rows),
            step_generator(self.device, self.config.seed, epoch, step),
            shard=(self.world.rank, self.world.size),
        )
        return StepInputs(rows, offsets, flip)

    def take_step(self, inputs: StepInputs, global_step: int) -> None:
        """One training step at the learning rate of `global_step` (eager, or a graph replay)."""
        self.lr.fill_(self.config.lr * self.schedule(global_step))
        self.run_step(inputs)

    def train_step(self, model: nn.Module, inputs: StepInputs) -> None:
        """The step a CUDA graph captures: nothing here may wait for the host or replace a
        tensor that outlives the step (the counters, the scale and the rate change in place)."""
        counters = self.counters
        images, labels = self.train_data.train_batch(inputs.rows, inputs.offsets, inputs.flip)
        # Under capture autocast must not cache its casts (torch.cuda.graphs' AMP rule).
        with self.precision.autocast(cache_enabled=not self.cuda_graphs):
            logits = model(images)
            loss = self.criterion(logits, labels)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if self.precision.grad_scaler:
            scale_before = self.scaler._scale.clone()  # type: ignore[union-attr]
        self.scaler.step(self.optimizer)
        self.scaler.update()
        counters.loss_sum += loss.detach().double() * len(labels)
        counters.correct += (logits.argmax(dim=1) == labels).sum()
        if self.precision.grad_scaler:
            # The scaler lowers its scale exactly when it skipped the step (inf/NaN grads).
            skipped = (self.scaler._scale < scale_before).double().squeeze()  # type: ignore[operator]
            counters.skipped += skipped
            counters.skip_streak.copy_((counters.skip_streak + 1) * skipped)
            torch.maximum(
                counters.longest_skip_streak, counters.skip_streak, out=counters.longest_skip_streak
            )
        else:
            first = (counters.first_bad_step < 0) & ~torch.isfinite(loss.detach())
            counters.first_bad_step.copy_(
                torch.where(first, counters.steps, counters.first_bad_step)
            )
        counters.steps += 1

    def run(self) -> ArmResults:
        config, state = self.config, self.state
        if config.resume:
            self.restore_checkpoint()
            state = self.state
        elif config.checkpoint_dir and checkpoint.names(config.checkpoint_dir):
            raise AmpbenchError(
                f"--checkpoint-dir {config.checkpoint_dir}: holds checkpoints of an earlier run; "
                "pass --resume to continue it, or use an empty directory"
            )
        if config.compile:
            # Dynamo's cache is per code object, shared by every model built in this process:
            # without a reset an earlier run's batch size makes this one's shapes dynamic, and
            # after 8 models it stops compiling without a word.
            torch._dynamo.reset()
        # Under torchrun: DDP, its gradient all-reduce in the arm's grad_comm precision.
        model = distributed.wrap(self.model, self.device, config.grad_comm)
        if config.compile:
            model = torch.compile(model, dynamic=False)
        self.run_step = StepRunner(lambda inputs: self.train_step(model, inputs))
        dropped = len(self.train_data) - self.steps_per_epoch * self.global_batch
        log.info(
            "train: %s on %s (%s), %s, %d images, %d epochs x %d steps, batch %d%s%s",
            config.model,
            self.device,
            self.device_record.name,
            self.precision.label,
            len(self.train_data),
            config.epochs,
            self.steps_per_epoch,
            self.global_batch,
            f" ({self.world.size} processes x {config.batch_size}, {distributed.backend()}, "
            f"gradients all-reduced in {config.grad_comm})"
            if self.world.distributed
            else "",
            f"; full batches only: the last {dropped} images of each epoch's order are not "
            "trained on"
            if dropped
            else "",
        )
        with math_mode(self.precision):
            self.memory.mark_resident()
            self.warm_up(model)  # inside math_mode: the code warmed up is the code timed
            self.memory.skip_window()
            gc.collect()  # not in the middle of a timed epoch
            while state.epoch < config.epochs and state.target_epoch is None:
                epoch = state.epoch
                order = epoch_order(len(self.train_data), config.seed, epoch, self.device)
                self.memory.reset_peak()
                distributed.barrier(self.device)  # every rank starts the clock together
                epoch_start = time.perf_counter()
                with Progress(
                    self.steps_per_epoch - state.step,
                    f"train {self.precision.name} epoch {epoch + 1}/{config.epochs}",
                    unit="step",
                ) as progress:
                    while state.step < self.steps_per_epoch:
                        self.take_step(
                            self.step_inputs(order, epoch, state.step), state.global_step
                        )
                        state.step += 1
                        state.global_step += 1
                        progress.update()
                        if state.global_step % HEALTH_CHECK_EVERY == 0:
                            self.check_health()
                        if (
                            config.checkpoint_every
                            and state.global_step % config.checkpoint_every == 0
                        ):
                            # The queued steps, on every rank, belong to training time.
                            distributed.barrier(self.device)
                            state.epoch_elapsed_s += time.perf_counter() - epoch_start
                            self.save_checkpoint()
                            epoch_start = time.perf_counter()
                distributed.barrier(self.device)  # the epoch ends when the slowest rank's does
                epoch_time = state.epoch_elapsed_s + (time.perf_counter() - epoch_start)
                # Rank 0's clock for all: each rank's differs by the barrier's return alone.
                epoch_time = distributed.broadcast_float(epoch_time, self.device)
                (train_peak_mb,) = distributed.max_over_ranks(
                    [self.memory.window_peak_mb()], self.device
                )
                self.check_health()
                record = self.finish_epoch(epoch, epoch_time, train_peak_mb)
                state.history.append(asdict(record))
                state.train_time_s += epoch_time
                if config.target_accuracy and record.test_accuracy >= config.target_accuracy:
                    # MLPerf's rule: stop at the first evaluation that reaches the target.
                    state.target_time_s, state.target_epoch = state.train_time_s, epoch + 1
                    log.info(
                        "target accuracy %g reached after epoch %d: %.2f s of training; stop",
                        config.target_accuracy,
                        epoch + 1,
                        state.train_time_s,
                    )
                state.epoch += 1
                state.step = 0
                state.epoch_elapsed_s = 0.0
                self.counters.reset()
                if config.checkpoint_dir:
                    self.save_checkpoint()
                # Whoever tracks the run does its work here, between epochs, off the clock.
                if self.on_epoch is not None:
                    self.on_epoch(record)
        return self.results()

    def finish_epoch(self, epoch: int, epoch_time: float, train_peak_mb: float) -> EpochRecord:
        """Read the epoch's counters and evaluate (its own memory window, timed apart)."""
        images = self.steps_per_epoch * self.global_batch
        # Sums over the ranks; skipped steps are the same on every rank (the gradients they
        # check for infs are all-reduced), so rank 0's count is the run's.
        sums = torch.stack([self.counters.loss_sum, self.counters.correct])
        loss_sum, correct = distributed.all_reduce(sums).tolist()
        skipped = self.counters.skipped.item()
        self.memory.reset_peak()
        distributed.broadcast_buffers(self.model)
        eval_start = time.perf_counter()
        evaluated = {
            split: evaluate(self.model, data, self.precision, self.eval_batch_size, self.world)
            for split, data in self.eval_data.items()
        }
        self.state.eval_time_s += time.perf_counter() - eval_start
        val = evaluated.get("val", (None, None))
        record = EpochRecord(
            epoch=epoch + 1,
            train_loss=loss_sum / images,
            train_accuracy=correct / images,
            test_loss=evaluated["test"][0],
            test_accuracy=evaluated["test"][1],
            val_loss=val[0],
            val_accuracy=val[1],
            time_s=epoch_time,
            throughput_img_s=images / epoch_time,
            train_peak_memory_mb=train_peak_mb,
            lr=self.config.lr * self.schedule(self.state.global_step - 1),
            # Every arm records both, so that all arms log the same metric names: without
            # a scaler the scale is 1 and nothing is skipped.
            loss_scale=self.scaler.get_scale() if self.precision.grad_scaler else 1.0,
            skipped_steps=int(skipped),
        )
        log.info(
            "epoch %d/%d %s: train loss %.4f, accuracy %.4f, test loss %.4f, accuracy %.4f, "
            "%.1f s, %.1f images/s",
            epoch + 1,
            self.config.epochs,
            self.precision.name,
            record.train_loss,
            record.train_accuracy,
            record.test_loss,
            record.test_accuracy,
            epoch_time,
            record.throughput_img_s,
        )
        return record

    def memory_record(self) -> Memory:
        """The run's memory; under torchrun each figure the largest of any rank's."""
        memory = self.memory.record()
        if not self.world.distributed:
            return memory
        names = [
            f.name for f in dataclasses.fields(memory) if isinstance(getattr(memory, f.name), float)
        ]
        peaks = distributed.max_over_ranks([getattr(memory, name) for name in names], self.device)
        return dataclasses.replace(memory, **dict(zip(names, peaks, strict=True)))

    def results(self) -> ArmResults:
        config, state, dataset = self.config, self.state, self.metadata
        epochs = [EpochRecord(**record) for record in state.history]
        last = epochs[-1]
        trained_images = len(epochs) * self.steps_per_epoch * self.global_batch
        return ArmResults(
            schema_version=RESULTS_SCHEMA_VERSION,
            precision=self.precision.record(),
            device=self.device_record,
            model=self.config.model,
            parameters=parameter_count(self.model),
            hyperparameters=self.hyperparameters(),
            dataset=DatasetRecord(
                path=str(self.config.dataset_dir),
                source=dataset["source"]["spec"],
                sha256=dataset["source"]["sha256"],
                classes=len(dataset["classes"]),
                image_shape=list(dataset["image_shape"]),
                train_images=len(self.train_data),
                test_images=len(self.eval_data["test"]),
            ),
            accuracy=last.test_accuracy,
            test_loss=last.test_loss,
            timing=Timing(
                train_time_s=state.train_time_s,
                throughput_img_s=trained_images / state.train_time_s,
                trained_images=trained_images,
                end_to_end_s=(
                    self.warmup_s + state.train_time_s + state.eval_time_s + state.checkpoint_time_s
                ),
                warmup_s=self.warmup_s,
                warmup_steps=self.config.warmup_steps,
                compile_s=self.compile_s,
                eval_s=state.eval_time_s,
                checkpoint_s=state.checkpoint_time_s,
                startup=self.startup.record(),
            ),
            memory=self.memory_record(),
            skipped_steps=sum(e.skipped_steps for e in epochs),
            loss_scale=self.scaler.get_scale() if self.precision.grad_scaler else None,
            resumed_from=self.resumed_from,
            versions=software_versions(),
            epochs=epochs,
            compute=self.compute_record(len(epochs) * self.steps_per_epoch),
            distributed=Distributed(
                world_size=self.world.size,
                per_rank_batch=config.batch_size,
                global_batch=self.global_batch,
                backend=distributed.backend(),
                grad_comm=config.grad_comm,
            ),
            time_to_target=TimeToTarget(
                config.target_accuracy,
                state.target_epoch is not None,
                state.target_time_s,
                state.target_epoch,
            )
            if config.target_accuracy
            else None,
        )


def train(
    config: TrainConfig, on_epoch: Callable[[EpochRecord], None] | None = None
) -> tuple[ArmResults, nn.Module]:
    """Train one arm; return its results (see ampbench/results.py) and the trained model."""
    trainer = Trainer(config, on_epoch)
    results = trainer.run()
    return results, trainer.model
