"""One arm set up for training: what loop.Trainer trains and measures, made in the protocol's
order (loop.py's docstring)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampbench.logs import log
from ampbench.preflight import preflight
from ampbench.process import StartupClock
from ampbench.train import distributed
from ampbench.train.checkpoint import Checkpointer, TrainingState, fingerprint
from ampbench.train.compile_cache import CompileCache, archive_name, location_of
from ampbench.train.config import TrainConfig
from ampbench.train.data import draw_crop_flip, read_to_device, step_generator
from ampbench.train.device import device_record, pick_device, seed_everything
from ampbench.train.energy import EnergyMeter
from ampbench.train.flops import FlopAccount, train_step_flops
from ampbench.train.fp8 import convert_for_fp8
from ampbench.train.graphs import StepInputs, settle_cuda_graphs
from ampbench.train.memory import MemoryMeter
from ampbench.train.models import build_model
from ampbench.train.optim import OneCycle, build_optimizer
from ampbench.train.record import Recorder
from ampbench.train.state import DeviceCounters, LoopState
from ampbench.world import world_from_env


class ArmSetup:
    """One arm set up for training (loop.Trainer trains it): device, precision, data, model,
    optimizer, and the collaborators that measure it (memory, FLOPs), checkpoint it and record
    it. The steps of __init__ keep the protocol's order (loop.py's docstring)."""

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        self._settle_device()
        self._read_data()
        self._build_model()
        self.state = LoopState()
        self.counters = DeviceCounters.zeros(self.device, self.steps_per_epoch)
        self.training = TrainingState(
            self.model, self.optimizer, self.scaler, self.lr, self.counters
        )
        self.checkpoints = Checkpointer(
            config,
            self.world,
            fingerprint(config, self.metadata, self.precision.name, self.world.size),
        )
        self.flops = FlopAccount(
            self.device.type, self.device_record.name, self.precision.name, self.world.size
        )
        self.record = Recorder(
            config=config,
            precision=self.precision,
            device_record=self.device_record,
            world=self.world,
            metadata=self.metadata,
            cuda_graphs=self.cuda_graphs,
            steps_per_epoch=self.steps_per_epoch,
            global_batch=self.global_batch,
            model=self.model,
            train_data=self.train_data,
            eval_data=self.eval_data,
            memory=self.memory,
            energy=self.energy,
            flops=self.flops,
            scaler=self.scaler,
            startup=self.startup,
        )

    def _settle_device(self) -> None:
        """The device, then the preflight (settings, precision, data set: a mistake fails
        before any data is read or a process group joined), then CUDA graphs; the memory
        baseline is read last."""
        config = self.config
        self.world = world_from_env()
        self.device = pick_device(
            config.device, self.world.local_rank if self.world.distributed else None
        )
        self.precision, self.metadata = preflight(
            config, "train", device=self.device, processes=self.world.size
        )
        distributed.join(self.world, self.device)
        self.device_record = device_record(self.device)
        log.info("precision: %s (%s)", self.precision.label, self.precision.support)
        self.cuda_graphs, graphs_state = settle_cuda_graphs(
            config.cuda_graphs, self.device, self.world, config.warmup_steps, config.compile
        )
        log.info("CUDA graphs: %s", graphs_state)
        seed_everything(config.seed, config.deterministic)
        self.memory = MemoryMeter(self.device)
        self.memory.start()
        self.energy = EnergyMeter(self.device, self.world)
        self.startup = StartupClock()  # imports done, the device initialised

    def _read_data(self) -> None:
        """The data set (preflight checked it against the settings) onto the device."""
        config = self.config
        self.train_data, self.eval_data = read_to_device(
            Path(config.dataset_dir),
            self.metadata,
            self.device,
            config.subset,
            config.seed,
            config.image_size,
        )
        # --batch-size is each process's; a step trains on the global batch.
        self.global_batch = config.batch_size * self.world.size
        self.eval_batch_size = config.eval_batch_size or config.batch_size
        self.steps_per_epoch = len(self.train_data) // self.global_batch

    def _build_model(self) -> None:
        """The model on the device, its optimizer, schedule, loss scaler and loss."""
        config = self.config
        self.model = build_model(
            config.model, len(self.metadata["classes"]), self.train_data.image_shape
        ).to(self.device, memory_format=torch.channels_last)  # type: ignore[call-overload]
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
        # float32: the fused CUDA kernel reads a tensor learning rate as a float.
        self.lr = torch.zeros((), device=self.device, dtype=torch.float32)
        # On CUDA the fused kernel takes the GradScaler's inf check on the device; any other
        # optimizer makes scaler.step() wait for the host on every fp16 step.
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

    def training_state(self) -> dict[str, Any]:
        """Everything a training step changes (references to the live tensors)."""
        return self.training.references()

    def hyperparameters(self) -> dict[str, Any]:
        return self.record.hyperparameters()

    def count_flops(self) -> None:
        """The FLOPs of one training step, counted once on the eager model (flops.py); the
        caller puts the training state back (the step moves BatchNorm's running stats)."""
        rows = torch.arange(self.config.batch_size, device=self.device)
        offsets, flip = draw_crop_flip(
            len(rows), step_generator(self.device, self.config.seed, 0, 0)
        )
        images, labels = self.train_data.train_batch(rows, offsets, flip)
        self.flops.record(
            train_step_flops(self.model, images, labels, self.criterion, self.precision.autocast())
        )

    def shared_compile_cache(self) -> CompileCache | None:
        """Where a compiled arm shares its compiled step (compile_cache.py), if anywhere."""
        config = self.config
        location = location_of(config.compile_cache)
        if not (config.compile and location):
            return None
        graph = {
            "torch": torch.__version__,
            "device": self.device_record.name,
            "image_shape": list(self.train_data.image_shape),
            "classes": len(self.metadata["classes"]),
            "processes": self.world.size,
            "cuda_graphs": self.cuda_graphs,
            "deterministic": config.deterministic,
        }
        name = archive_name(config.model, config.batch_size, self.precision.name, graph)
        return CompileCache(location, name)

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

    def log_arm(self) -> None:
        """The arm in one log line, as run() starts it."""
        config = self.config
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
