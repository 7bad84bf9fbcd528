"""The training engine: one arm (a precision) trained and measured, as plainly as possible.

Every figure it reports means exactly one thing:
- train_time_s: wall time of the training epochs, device-synchronised; evaluation, checkpoint
  writes and torch.compile's warm-up are timed apart (eval_time_s, checkpoint_time_s,
  compile_time_s).
- throughput_img_s: training images per second, without the process's first WARMUP_STEPS
  steps (autotuning, allocator growth; at most half the steps of a short run) and without
  compilation.
- peak_memory_mb: the highest of the epochs' peaks (each epoch, with its evaluation, is one
  window). CUDA: torch.cuda.max_memory_allocated; CPU: growth of the process's peak resident
  set (the kernel's high-water mark) over its size before the data was loaded. Either way it
  counts everything the run holds: the uint8 dataset on the device (about 176 MiB for
  CIFAR-10), the model, optimizer state and activations.
"""

from __future__ import annotations

import gc
import os
import platform
import random
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision
from torch import nn

from ampbench import __version__
from ampbench.components.train import checkpoint
from ampbench.components.train.config import TrainConfig
from ampbench.components.train.data import DeviceSplit, epoch_order, step_generator
from ampbench.components.train.models import build_model, parameter_count
from ampbench.components.train.precision import Precision, math_mode, resolve
from ampbench.dataset_format import SplitTensors, read_metadata, read_split
from ampbench.errors import AmpbenchError
from ampbench.logs import Progress, log
from ampbench.sampling import stratified_take

RESULTS_SCHEMA_VERSION = 1
WARMUP_STEPS = 5
HEALTH_CHECK_EVERY = 50  # steps between the (only) host syncs inside an epoch


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise AmpbenchError(
            f"--device: '{name}' is not a device (auto, cpu, cuda, cuda:N)"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise AmpbenchError(f"--device {name}: no CUDA GPU is visible to this process")
    if device.type not in ("cpu", "cuda"):
        raise AmpbenchError(f"--device {name}: only cpu and cuda are supported")
    if device.type == "cuda":
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise AmpbenchError(
                f"--device {name}: this process sees {torch.cuda.device_count()} CUDA GPU(s)"
            )
        # Later calls that take no device (empty_cache) act on this one.
        torch.cuda.set_device(device)
    return device


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def software_versions() -> dict[str, Any]:
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "ampbench": __version__,
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "python": platform.python_version(),
    }


class MemoryMeter:
    """Peak memory of one run; see the module docstring for what it means per device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.baseline = 0

    @staticmethod
    def _status_kb(field_name: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
        return 0

    def start(self) -> None:
        """Take the baseline: the run's memory is what comes after this."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            gc.collect()  # an earlier run's unreferenced tensors would count against this one
            torch.cuda.empty_cache()
        else:
            self.baseline = self._status_kb("VmRSS")
        self.reset_peak()

    def reset_peak(self) -> None:
        """Start a new window for peak_mb() (each epoch is one)."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:  # "5" resets the kernel's peak-RSS mark (VmHWM) for this process
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            log.warning("cannot reset the peak-RSS mark; CPU peak memory includes earlier work")

    def peak_mb(self) -> float:
        """The peak since the last reset_peak(); see the module docstring."""
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        return max(0, self._status_kb("VmHWM") - self.baseline) / 1024

    def reserved_mb(self) -> float | None:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_reserved(self.device) / 2**20
        return None

    @property
    def kind(self) -> str:
        return "cuda_max_allocated" if self.device.type == "cuda" else "cpu_peak_rss_growth"


def max_or_none(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        # cuBLAS needs this before its first call to be deterministic.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # Set both ways: an earlier run in this process may have turned them on. warn_only: CUDA
    # has no deterministic backward for adaptive pooling (every model here ends with one);
    # torch warns, naming the op, instead of refusing the run.
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = not deterministic


@torch.no_grad()
def evaluate(
    model: nn.Module, data: DeviceSplit, precision: Precision, batch_size: int
) -> tuple[float, float]:
    """(mean loss, accuracy) on a split, under the arm's autocast, with one host sync."""
    model.eval()
    loss_sum = torch.zeros((), device=data.device)
    correct = torch.zeros((), device=data.device, dtype=torch.long)
    for images, labels in data.eval_batches(batch_size):
        with precision.autocast():
            logits = model(images)
        loss_sum += nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
        correct += (logits.argmax(dim=1) == labels).sum()
    model.train()
    totals = torch.stack([loss_sum, correct.float()]).tolist()
    return totals[0] / len(data), totals[1] / len(data)


def _subset(split: SplitTensors, count: int, seed: int) -> SplitTensors:
    if not count or count >= len(split):
        return split
    rows = torch.from_numpy(
        stratified_take(split.labels.numpy(), count, np.random.default_rng(seed))
    )
    return SplitTensors(split.images[rows], split.labels[rows], split.indices[rows])


@dataclass(frozen=True)
class OneCycle:
    """Learning-rate factor per step: linear warm-up to 1, then linear decay to 0 at the end."""

    total_steps: int
    warmup_fraction: float

    def __call__(self, step: int) -> float:
        warmup = max(1, round(self.total_steps * self.warmup_fraction))
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (self.total_steps - step) / max(1, self.total_steps - warmup))


@dataclass
class LoopState:
    """Everything the loop needs to continue where it stopped; saved in each checkpoint."""

    epoch: int = 0
    step: int = 0  # next step within the epoch
    global_step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    train_time_s: float = 0.0  # completed epochs
    epoch_elapsed_s: float = 0.0  # the current epoch, up to the last checkpoint
    eval_time_s: float = 0.0
    checkpoint_time_s: float = 0.0


@dataclass
class DeviceCounters:
    """Per-step statistics kept on the device so that the hot loop never waits for the host."""

    loss_sum: torch.Tensor
    correct: torch.Tensor
    first_bad_step: torch.Tensor  # first step with a non-finite loss (non-fp16), -1 if none
    skipped: torch.Tensor  # fp16 steps the GradScaler skipped, this epoch
    skip_streak: torch.Tensor
    longest_skip_streak: torch.Tensor

    @classmethod
    def zeros(cls, device: torch.device) -> DeviceCounters:
        def zero() -> torch.Tensor:
            return torch.zeros((), device=device, dtype=torch.float64)

        counters = cls(zero(), zero(), zero(), zero(), zero(), zero())
        counters.first_bad_step.fill_(-1)
        return counters

    def state(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> DeviceCounters:
        return cls(**state)


class Trainer:
    def __init__(
        self, config: TrainConfig, on_epoch: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        config.validate()
        self.config = config
        self.on_epoch = on_epoch
        self.device = pick_device(config.device)
        # Settle the precision first: an impossible one fails before any data is read.
        self.precision = resolve(config.precision, self.device)
        seed_everything(config.seed, config.deterministic)
        self.memory = MemoryMeter(self.device)
        self.memory.start()
        self.metadata = read_metadata(Path(config.dataset_dir))
        if "test" not in self.metadata["counts"]:
            raise AmpbenchError(
                f"{config.dataset_dir}: the prepared dataset has no test split to measure on"
            )
        mean, std = self.metadata["mean"], self.metadata["std"]
        train_split = _subset(
            read_split(Path(config.dataset_dir), "train"), config.subset, config.seed
        )
        self.train_data = DeviceSplit(train_split, self.device, mean, std)
        self.eval_data = {
            split: DeviceSplit(
                _subset(read_split(Path(config.dataset_dir), split), config.subset, config.seed),
                self.device,
                mean,
                std,
            )
            for split in ("val", "test")
            if split in self.metadata["counts"]
        }
        self.steps_per_epoch = len(self.train_data) // config.batch_size
        if self.steps_per_epoch == 0:
            raise AmpbenchError(
                f"--batch-size {config.batch_size}: larger than the {len(self.train_data)} "
                "training images"
            )
        self.model = build_model(config.model, len(self.metadata["classes"])).to(
            self.device, memory_format=torch.channels_last
        )
        self.optimizer = torch.optim.SGD(
            self.model.parameters(),
            lr=config.lr,
            momentum=config.momentum,
            nesterov=True,
            weight_decay=config.weight_decay,
            # On CUDA the fused kernel takes the GradScaler's inf check on the device; any
            # other optimizer makes scaler.step() wait for the host on every fp16 step.
            fused=self.device.type == "cuda",
        )
        self.schedule = OneCycle(self.steps_per_epoch * config.epochs, config.warmup_fraction)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.schedule)
        self.scaler = torch.amp.GradScaler(
            self.device.type,
            init_scale=config.initial_loss_scale,
            enabled=self.precision.grad_scaler,
        )
        self.criterion = nn.CrossEntropyLoss(label_smoothing=config.label_smoothing)
        self.state = LoopState()
        self.counters = DeviceCounters.zeros(self.device)
        self.resumed_from: str | None = None
        self.compile_time_s = 0.0

    # -- checkpoints -------------------------------------------------------------------------
    def fingerprint(self) -> dict[str, Any]:
        """What must match for a checkpoint to continue this run."""
        return {
            "dataset_sha256": self.metadata["source"]["sha256"],
            "dataset_counts": self.metadata["counts"],
            "precision": self.precision.name,
            **{k: v for k, v in self.config.hyperparameters().items() if k != "compile"},
        }

    def save_checkpoint(self) -> None:
        assert self.config.checkpoint_dir is not None
        started = time.perf_counter()
        state = {
            "fingerprint": self.fingerprint(),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": checkpoint.rng_states(),
            "loop": asdict(self.state),
            "counters": self.counters.state(),
        }
        location = checkpoint.save(
            self.config.checkpoint_dir, self.state.global_step, state, self.config.keep_checkpoints
        )
        self.state.checkpoint_time_s += time.perf_counter() - started
        log.debug("checkpoint %s", location)

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
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        checkpoint.restore_rng_states(state["rng"])
        self.state = LoopState(**state["loop"])
        self.counters = DeviceCounters.from_state(
            {name: value.to(self.device) for name, value in state["counters"].items()}
        )
        self.resumed_from = location
        log.info("resume: %s (epoch %d, step %d)", location, self.state.epoch + 1, self.state.step)

    # -- the loop ----------------------------------------------------------------------------
    def check_health(self) -> None:
        """The loop's only mid-epoch host sync: stop a run that has diverged."""
        counters = self.counters
        if self.precision.grad_scaler:
            streak = int(counters.longest_skip_streak.item())
            if streak >= self.config.max_skipped_steps:
                raise AmpbenchError(
                    f"fp16: the GradScaler skipped {streak} steps in a row (loss scale "
                    f"{self.scaler.get_scale():g}): gradients overflow on every step; "
                    "lower --lr or use bf16"
                )
            return
        bad = int(counters.first_bad_step.item())
        if bad >= 0:
            raise AmpbenchError(
                f"training diverged: the loss became NaN or inf at step {bad} (epoch "
                f"{bad // self.steps_per_epoch + 1}, {self.precision.name}); lower --lr"
            )

    def warm_up_compiled(self, compiled: nn.Module) -> None:
        """Compile before timing starts: forward and backward on one batch. Weights are not
        stepped, and BatchNorm's running statistics are put back as they were."""
        buffers = {name: buffer.clone() for name, buffer in self.model.named_buffers()}
        started = time.perf_counter()
        rows = torch.arange(self.config.batch_size, device=self.device)
        images, labels = self.train_data.train_batch(rows, step_generator(self.device, 0, 0, 0))
        with self.precision.autocast():
            loss = self.criterion(compiled(images), labels)
        self.scaler.scale(loss).backward()
        self.optimizer.zero_grad(set_to_none=True)
        _sync(self.device)
        self.compile_time_s = time.perf_counter() - started
        with torch.no_grad():
            for name, buffer in self.model.named_buffers():
                buffer.copy_(buffers[name])
        log.info("compile: %.1f s (not counted in training time)", self.compile_time_s)

    def train_step(self, model: nn.Module, rows: torch.Tensor, epoch: int, step: int) -> None:
        config, counters = self.config, self.counters
        images, labels = self.train_data.train_batch(
            rows, step_generator(self.device, config.seed, epoch, step)
        )
        with self.precision.autocast():
            logits = model(images)
            loss = self.criterion(logits, labels)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if self.precision.grad_scaler:
            scale_before = self.scaler._scale.clone()  # type: ignore[union-attr]
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
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
            finite = torch.isfinite(loss.detach())
            first = (counters.first_bad_step < 0) & ~finite
            counters.first_bad_step.copy_(
                torch.where(first, float(self.state.global_step), counters.first_bad_step)
            )

    def run(self) -> dict[str, Any]:
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
        model: nn.Module = (
            torch.compile(self.model, dynamic=False) if config.compile else self.model
        )
        measured_images = 0
        measured_time = 0.0
        # Short runs keep at least half their steps for the measurement.
        remaining = config.epochs * self.steps_per_epoch - state.global_step
        warm_steps_left = min(WARMUP_STEPS, remaining // 2)
        batch = config.batch_size
        log.info(
            "train: %s on %s (%s), %s, %d images, %d epochs x %d steps, batch %d",
            config.model,
            self.device,
            device_name(self.device),
            self.precision.name,
            len(self.train_data),
            config.epochs,
            self.steps_per_epoch,
            batch,
        )
        with math_mode(self.precision), warnings.catch_warnings():
            # When fp16's first step is skipped, torch warns that the scheduler stepped first.
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            if config.compile:  # inside math_mode: the compiled code is the one that is timed
                self.warm_up_compiled(model)
            while state.epoch < config.epochs:
                epoch = state.epoch
                order = epoch_order(len(self.train_data), config.seed, epoch, self.device)
                _sync(self.device)
                self.memory.reset_peak()
                epoch_start = time.perf_counter()
                measure_start, measure_from_step = epoch_start, state.step
                checkpoint_time_at_measure_start = state.checkpoint_time_s
                with Progress(
                    self.steps_per_epoch - state.step,
                    f"train {self.precision.name} epoch {epoch + 1}/{config.epochs}",
                    unit="step",
                ) as progress:
                    while state.step < self.steps_per_epoch:
                        step = state.step
                        self.train_step(
                            model, order[step * batch : (step + 1) * batch], epoch, step
                        )
                        state.step += 1
                        state.global_step += 1
                        progress.update()
                        if warm_steps_left > 0:
                            warm_steps_left -= 1
                            if warm_steps_left == 0:
                                _sync(self.device)
                                measure_start, measure_from_step = time.perf_counter(), state.step
                                checkpoint_time_at_measure_start = state.checkpoint_time_s
                        if state.global_step % HEALTH_CHECK_EVERY == 0:
                            self.check_health()
                        if (
                            config.checkpoint_every
                            and state.global_step % config.checkpoint_every == 0
                        ):
                            _sync(self.device)  # the queued steps belong to training time
                            state.epoch_elapsed_s += time.perf_counter() - epoch_start
                            self.save_checkpoint()
                            epoch_start = time.perf_counter()
                _sync(self.device)
                now = time.perf_counter()
                self.check_health()
                epoch_time = state.epoch_elapsed_s + (now - epoch_start)
                # An epoch that ends inside the warm-up measures nothing.
                steps_measured = state.step - measure_from_step if warm_steps_left == 0 else 0
                time_measured = (
                    now
                    - measure_start
                    - (state.checkpoint_time_s - checkpoint_time_at_measure_start)
                )
                if steps_measured:
                    measured_images += steps_measured * batch
                    measured_time += time_measured
                record = self.finish_epoch(epoch, epoch_time, steps_measured, time_measured)
                state.history.append(record)
                state.train_time_s += epoch_time
                state.epoch += 1
                state.step = 0
                state.epoch_elapsed_s = 0.0
                self.counters = DeviceCounters.zeros(self.device)
                if self.on_epoch is not None:
                    self.on_epoch(record)
                if config.checkpoint_dir:
                    self.save_checkpoint()
        return self.results(measured_images, measured_time)

    def finish_epoch(
        self, epoch: int, epoch_time: float, steps_measured: int, measured_time: float
    ) -> dict[str, Any]:
        images = self.steps_per_epoch * self.config.batch_size
        totals = torch.stack([self.counters.loss_sum, self.counters.correct, self.counters.skipped])
        loss_sum, correct, skipped = totals.tolist()
        eval_start = time.perf_counter()
        record: dict[str, Any] = {
            "epoch": epoch + 1,
            "train_loss": loss_sum / images,
            "train_accuracy": correct / images,
        }
        for split, data in self.eval_data.items():
            loss, accuracy = evaluate(self.model, data, self.precision, self.config.eval_batch_size)
            record[f"{split}_loss"] = loss
            record[f"{split}_accuracy"] = accuracy
        self.state.eval_time_s += time.perf_counter() - eval_start
        record.update(
            {
                "time_s": epoch_time,
                "throughput_img_s": (
                    steps_measured * self.config.batch_size / measured_time
                    if measured_time > 0
                    else None
                ),
                "peak_memory_mb": self.memory.peak_mb(),
                "peak_memory_reserved_mb": self.memory.reserved_mb(),
                "lr": self.config.lr * self.schedule(self.state.global_step - 1),
                # Every arm records both, so that all arms log the same metric names: without
                # a scaler the scale is 1 and nothing is skipped.
                "loss_scale": self.scaler.get_scale() if self.precision.grad_scaler else 1.0,
                "skipped_steps": int(skipped),
            }
        )
        summary = ", ".join(
            f"{key} {value:.4f}"
            for key, value in record.items()
            if key.endswith(("loss", "accuracy"))
        )
        log.info(
            "epoch %d/%d %s: %s, %.1f s",
            epoch + 1,
            self.config.epochs,
            self.precision.name,
            summary,
            epoch_time,
        )
        return record

    def results(self, measured_images: int, measured_time: float) -> dict[str, Any]:
        history = self.state.history
        last = history[-1]
        dataset = self.metadata
        results: dict[str, Any] = {
            "schema_version": RESULTS_SCHEMA_VERSION,
            **self.precision.describe(),
            "device": self.device.type,
            "device_name": device_name(self.device),
            "model": self.config.model,
            "parameters": parameter_count(self.model),
            "hyperparameters": self.config.hyperparameters(),
            "dataset": {
                "path": str(self.config.dataset_dir),
                "source": dataset["source"]["spec"],
                "sha256": dataset["source"]["sha256"],
                "classes": len(dataset["classes"]),
                "train_images": len(self.train_data),
                "test_images": len(self.eval_data["test"]) if "test" in self.eval_data else 0,
            },
            "accuracy": last.get("test_accuracy"),
            "test_loss": last.get("test_loss"),
            # The peak of the epochs' windows (training and evaluation).
            "peak_memory_mb": max(r["peak_memory_mb"] for r in history),
            "peak_memory_reserved_mb": max_or_none(
                r.get("peak_memory_reserved_mb") for r in history
            ),
            "memory_kind": self.memory.kind,
            "train_time_s": self.state.train_time_s,
            "throughput_img_s": measured_images / measured_time if measured_time > 0 else None,
            "eval_time_s": self.state.eval_time_s,
            "compile_time_s": self.compile_time_s,
            "checkpoint_time_s": self.state.checkpoint_time_s,
            "skipped_steps": sum(r["skipped_steps"] for r in history),
            "loss_scale": self.scaler.get_scale() if self.precision.grad_scaler else None,
            "resumed_from": self.resumed_from,
            "versions": software_versions(),
            "epochs": history,
        }
        return results


def train(
    config: TrainConfig, on_epoch: Callable[[dict[str, Any]], None] | None = None
) -> tuple[dict[str, Any], nn.Module]:
    """Train one arm; return its results (see the module docstring) and the trained model."""
    trainer = Trainer(config, on_epoch)
    results = trainer.run()
    return results, trainer.model
