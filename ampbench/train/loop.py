"""The training loop: one arm (a precision) trained and measured, as plainly as possible.

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
What each figure means is written once, in ampbench/comparison.py (DEFINITIONS) and results.py.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from ampbench.errors import AmpbenchError
from ampbench.logs import Progress, log
from ampbench.results import ArmResults, EpochRecord, Fp16Numerics, Profile
from ampbench.train import distributed
from ampbench.train.arm import ArmSetup
from ampbench.train.checkpoint import host_copy
from ampbench.train.compile_cache import CompileCache
from ampbench.train.config import TrainConfig
from ampbench.train.data import epoch_order
from ampbench.train.device import sync
from ampbench.train.flops import flop_counter_mode
from ampbench.train.graphs import StepInputs, StepRunner
from ampbench.train.numerics import fp16_numerics
from ampbench.train.precision import math_mode
from ampbench.train.profile import profile_arm
from ampbench.train.record import evaluate
from ampbench.train.state import WarmUpRecord

HEALTH_CHECK_EVERY = 50  # steps between the (only) host syncs inside an epoch


class Trainer(ArmSetup):
    """Trains and measures one arm (arm.py sets it up): run() is the protocol, step by step."""

    def __init__(
        self, config: TrainConfig, on_epoch: Callable[[EpochRecord], None] | None = None
    ) -> None:
        super().__init__(config)
        self.on_epoch = on_epoch
        # run() makes it anew around the model it trains (DDP-wrapped, compiled).
        self.run_step = StepRunner(lambda inputs: self.train_step(self.model, inputs))
        self.resumed_from: str | None = None
        self.warm = WarmUpRecord()
        self.compile_cache: CompileCache | None = None  # kept: compiled code lives in it
        self.numerics: Fp16Numerics | None = None
        self.profile: Profile | None = None
        self.trace_path: Path | None = None  # where the profile's Chrome trace goes, if kept
        self.startup.state_ready()  # last in __init__: the warm-up can start

    def run(self) -> ArmResults:
        restored = self.checkpoints.start(self.training)
        if restored is not None:
            self.state, self.resumed_from = restored
        model = self.model_to_train()
        self.log_arm()
        with math_mode(self.precision):
            self.memory.mark_resident()
            self.energy.begin()  # the end-to-end window: warm-up, epochs, evaluation
            self.warm_up(model)  # inside math_mode: the code warmed up is the code timed
            self.memory.skip_window()
            gc.collect()  # not in the middle of a timed epoch
            while self.state.epoch < self.config.epochs and self.state.target_epoch is None:
                self.train_epoch()
            self.off_the_record()
        return self.results()

    def off_the_record(self) -> None:
        """What is measured after the epochs and kept out of every other figure: the end-to-end
        window closes, the last memory window is folded in, then fp16's numerics and the
        profile run, their own memory window skipped."""
        self.energy.end()
        self.memory.reset_peak()
        if self.precision.grad_scaler:
            self.numerics = self.measure_fp16_numerics()
        if self.config.profile_steps and self.state.epoch:
            self.profile = self.profile_steps()
        self.memory.skip_window()

    def model_to_train(self) -> nn.Module:
        """The model as the steps run it (DDP-wrapped under torchrun, compiled with
        --compile), and run_step made around it."""
        if self.config.compile:
            # Dynamo's cache is per code object, shared by every model built in this process:
            # without a reset an earlier run's batch size makes this one's shapes dynamic, and
            # after 8 models it stops compiling without a word.
            torch._dynamo.reset()
        # Under torchrun: DDP, its gradient all-reduce in the arm's grad_comm precision.
        model = distributed.wrap(self.model, self.device, self.config.grad_comm)
        if self.config.compile:
            model = torch.compile(model, dynamic=False)  # type: ignore[assignment]
        self.run_step = StepRunner(lambda inputs: self.train_step(model, inputs))
        return model

    def train_epoch(self) -> None:
        """One epoch: its steps on the clock, then its record, checkpoint and tracking."""
        state = self.state
        epoch = state.epoch
        order = epoch_order(len(self.train_data), self.config.seed, epoch, self.device)
        self.memory.reset_peak()
        distributed.barrier(self.device)  # every rank starts the clock together
        epoch_start = self.timed_steps(order, epoch)
        distributed.barrier(self.device)  # the epoch ends when the slowest rank's does
        epoch_time = state.epoch_elapsed_s + (time.perf_counter() - epoch_start)
        state.train_energy_j += self.energy.close()
        # Rank 0's clock for all: each rank's differs by the barrier's return alone.
        epoch_time = distributed.broadcast_float(epoch_time, self.device)
        (train_peak_mb,) = distributed.max_over_ranks([self.memory.window_peak_mb()], self.device)
        self.memory.read_nvml()
        self.check_health()
        record = self.finish_epoch(epoch, epoch_time, train_peak_mb)
        state.close_epoch(asdict(record), epoch_time, self.config.target_accuracy)
        self.counters.reset()
        if self.config.checkpoint_dir:
            self.checkpoints.write(self.training, state)
        # Whoever tracks the run does its work here, between epochs, off the clock.
        if self.on_epoch is not None:
            self.on_epoch(record)

    def timed_steps(self, order: torch.Tensor, epoch: int) -> float:
        """The epoch's remaining steps; the clock's start of its last stretch (a checkpoint
        stops the clock while it is written)."""
        state, config = self.state, self.config
        self.energy.open()  # read before the clock starts, and after it stops
        epoch_start = time.perf_counter()
        with Progress(
            self.steps_per_epoch - state.step,
            f"train {self.precision.name} epoch {epoch + 1}/{config.epochs}",
            unit="step",
        ) as progress:
            while state.step < self.steps_per_epoch:
                self.take_step(self.step_inputs(order, epoch, state.step), state.global_step)
                state.step += 1
                state.global_step += 1
                progress.update()
                if state.global_step % HEALTH_CHECK_EVERY == 0:
                    self.check_health()
                if config.checkpoint_every and state.global_step % config.checkpoint_every == 0:
                    # The queued steps, on every rank, belong to training time.
                    distributed.barrier(self.device)
                    state.epoch_elapsed_s += time.perf_counter() - epoch_start
                    state.train_energy_j += self.energy.close()
                    self.checkpoints.write(self.training, state)
                    self.energy.open()
                    epoch_start = time.perf_counter()
        return epoch_start

    def finish_epoch(self, epoch: int, epoch_time: float, train_peak_mb: float) -> EpochRecord:
        """Read the epoch's counters and evaluate (its own memory window, timed apart)."""
        # Sums over the ranks; skipped steps are the same on every rank (the gradients they
        # check for infs are all-reduced), so rank 0's count is the run's.
        sums = torch.stack([self.counters.loss_sum, self.counters.correct])
        loss_sum, correct = distributed.all_reduce(sums).tolist()
        skipped = self.counters.skipped.item()
        loss_scales = (
            self.counters.loss_scales[: self.steps_per_epoch].tolist()
            if self.precision.grad_scaler
            else None
        )
        self.memory.reset_peak()
        distributed.broadcast_buffers(self.model)
        eval_start = time.perf_counter()
        evaluated = {
            split: evaluate(self.model, data, self.precision, self.eval_batch_size, self.world)
            for split, data in self.eval_data.items()
        }
        self.state.eval_time_s += time.perf_counter() - eval_start
        lr = self.config.lr * self.schedule(self.state.global_step - 1)
        return self.record.epoch(
            epoch,
            epoch_time,
            train_peak_mb,
            (loss_sum, correct, skipped),
            evaluated,
            lr,
            loss_scales,
        )

    def check_health(self) -> None:
        """The loop's only mid-epoch host sync: stop a run that has diverged."""
        longest_streak, bad = self.counters.worst_over_ranks()
        if self.precision.grad_scaler:
            if longest_streak >= self.config.max_skipped_steps:
                raise AmpbenchError(
                    f"fp16: the GradScaler skipped {longest_streak} steps in a row (loss scale "
                    f"{self.scaler.get_scale():g}): gradients overflow on every step; "
                    "lower --lr or use bf16"
                )
            return
        if bad >= 0:
            bad += self.state.epoch * self.steps_per_epoch
            raise AmpbenchError(
                f"training diverged: the loss became NaN or inf at step {bad} (epoch "
                f"{bad // self.steps_per_epoch + 1}, {self.precision.name}); lower --lr"
            )

    def warm_up(self, model: nn.Module) -> None:
        """Untimed real training steps that pay the one-time costs, then undone (step 3 of
        the protocol in the module docstring); the FLOPs of a step are counted here too, and
        the step is captured as a CUDA graph where it is replayed."""
        steps = self.config.warmup_steps
        if self.state.epoch >= self.config.epochs:  # nothing left to time
            return
        saved = host_copy(self.training_state())
        # FLOPs are counted on the eager model of one process: in the first warm-up step
        # where that is what trains (one step less per arm), else in a step of their own.
        counted_in_warm_up = steps > 0 and model is self.model
        if not counted_in_warm_up:
            self.count_flops()
        if steps == 0:  # no graph either: settle_cuda_graphs asks for a warm-up step
            self.training.load(saved)
            return
        order = epoch_order(len(self.train_data), self.config.seed, self.state.epoch, self.device)
        started = time.perf_counter()
        self.compile_cache = self.shared_compile_cache()  # fetched on the warm-up's clock
        with self.compile_cache or contextlib.nullcontext():
            self.warm_up_steps(order, counted_in_warm_up, started)
            sync(self.device)
            self.training.load(saved)
            if self.cuda_graphs:
                self.capture()
            self.warm.seconds = time.perf_counter() - started
            if self.compile_cache is not None:  # packed back (rank 0) off the clock
                self.warm.compile_cache = self.compile_cache.finish(store=self.world.rank == 0)
        log.info(
            "warm-up: %d steps%s in %.1f s%s, undone; not counted in training time",
            steps,
            " and the CUDA graph's capture" if self.cuda_graphs else "",
            self.warm.seconds,
            f" (compilation {self.warm.compile_s:.1f} s)" if self.config.compile else "",
        )

    def warm_up_steps(self, order: torch.Tensor, count_flops: bool, started: float) -> None:
        """The warm-up's steps, the first one's FLOPs counted where `count_flops`."""
        epoch, steps = self.state.epoch, self.config.warmup_steps
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
                if warm_step == 0 and count_flops:
                    with flop_counter_mode() as counter:
                        self.take_step(inputs, global_step)
                    self.flops.record(counter.get_total_flops())
                else:
                    self.take_step(inputs, global_step)
                progress.update()
                if warm_step == 0 and self.config.compile:
                    sync(self.device)
                    self.warm.compile_s = time.perf_counter() - started
        if stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(stream)

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

    def take_step(self, inputs: StepInputs, global_step: int) -> None:
        """One training step at the learning rate of `global_step` (eager, or a graph replay)."""
        self.lr.fill_(self.config.lr * self.schedule(global_step))
        self.run_step(inputs)

    def train_step(self, model: nn.Module, inputs: StepInputs) -> None:
        """The step a CUDA graph captures: nothing here may wait for the host or replace a
        tensor that outlives the step (the counters, the scale and the rate change in place)."""
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
        scales = (scale_before, self.scaler._scale) if self.precision.grad_scaler else None
        self.counters.count_step(loss, logits, labels, scales)  # type: ignore[arg-type]

    def measure_fp16_numerics(self) -> Fp16Numerics:
        """fp16's gradients with and without the loss scale (numerics.py), on the first batch
        of the first epoch, after the epochs and off the clock; BatchNorm's statistics, which
        its forward pass moves, are put back."""
        buffers = {name: b.detach().clone() for name, b in self.model.named_buffers()}
        order = epoch_order(len(self.train_data), self.config.seed, 0, self.device)
        inputs = self.step_inputs(order, 0, 0)

        def loss_of(model: nn.Module) -> torch.Tensor:
            images, labels = self.train_data.train_batch(inputs.rows, inputs.offsets, inputs.flip)
            return self.criterion(model(images), labels)

        found = fp16_numerics(self.model, loss_of, self.precision, self.scaler.get_scale())
        with torch.no_grad():
            for name, buffer in self.model.named_buffers():
                buffer.copy_(buffers[name])
        log.info(
            "fp16 numerics: loss %.4g, scaled by %g: %.4g; of %d nonzero gradient elements "
            "%.2f%% would flush to zero in fp16 without the scale, %.2f%% overflow at it",
            found.loss,
            found.loss_scale,
            found.scaled_loss,
            found.gradient_elements,
            100 * found.underflow_share,
            100 * found.overflow_share,
        )
        return found

    def profile_steps(self) -> Profile:
        """--profile-steps more steps of the last epoch's, run as the arm trained (profile.py),
        then one eager step counted by dtype; the training state put back after."""
        saved = host_copy(self.training_state())
        epoch = self.state.epoch - 1
        order = epoch_order(len(self.train_data), self.config.seed, epoch, self.device)
        first = epoch * self.steps_per_epoch

        def step(index: int) -> None:
            within = index % self.steps_per_epoch
            self.take_step(self.step_inputs(order, epoch, within), first + within)

        def eager_step() -> None:
            self.train_step(self.model, self.step_inputs(order, epoch, 0))

        low = self.precision.autocast_dtype
        if low is None and self.precision.fp8_recipe is not None:
            low = torch.float8_e4m3fn
        found = profile_arm(
            step,
            self.config.profile_steps,
            self.device,
            self.cuda_graphs,
            eager_step,
            self.model,
            low,
            self.trace_path,
        )
        self.training.load(saved)
        log.info(
            "profile: %d steps off the clock (undone): device busy %.0f%% of wall time, "
            "matmul and convolution %.0f%% of device time%s%s",
            found.steps,
            100 * found.device_busy_share,
            100 * found.matmul_conv_share,
            ""
            if found.low_precision_flop_share is None
            else f", {found.low_precision_flop_share:.0%} of matmul FLOPs in {low}",
            f"; trace {self.trace_path}" if found.trace else "",
        )
        return found

    def results(self) -> ArmResults:
        return self.record.results(
            self.state, self.warm, self.resumed_from, self.numerics, self.profile
        )


def train(
    config: TrainConfig, on_epoch: Callable[[EpochRecord], None] | None = None
) -> tuple[ArmResults, nn.Module]:
    """Train one arm; return its results (see ampbench/results.py) and the trained model."""
    trainer = Trainer(config, on_epoch)
    results = trainer.run()
    return results, trainer.model
