"""The arm's figures in the terms of ampbench/results.py: each epoch's record, and the arm's
results. The loop measures; this writes down what it measured (and evaluates, for the epochs)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ampbench.logs import log
from ampbench.process import StartupClock
from ampbench.results import (
    RESULTS_SCHEMA_VERSION,
    ArmResults,
    DatasetRecord,
    DeviceRecord,
    Distributed,
    EpochRecord,
    Fp16Numerics,
    Profile,
    TimeToTarget,
    Timing,
)
from ampbench.train import distributed
from ampbench.train.config import TrainConfig
from ampbench.train.data import DeviceSplit
from ampbench.train.device import software_versions
from ampbench.train.energy import EnergyMeter
from ampbench.train.flops import FlopAccount
from ampbench.train.memory import MemoryMeter
from ampbench.train.models import parameter_count
from ampbench.train.precision import Precision
from ampbench.train.state import LoopState, WarmUpRecord
from ampbench.world import SINGLE_PROCESS, World


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


class Recorder:
    """Builds the records from the run's parts. Everything is read when a record is built, not
    before: the evaluation splits, for one, may be cut down after the Trainer is made."""

    def __init__(
        self,
        *,
        config: TrainConfig,
        precision: Precision,
        device_record: DeviceRecord,
        world: World,
        metadata: dict[str, Any],
        cuda_graphs: bool,
        steps_per_epoch: int,
        global_batch: int,
        model: nn.Module,
        train_data: DeviceSplit,
        eval_data: dict[str, DeviceSplit],
        memory: MemoryMeter,
        energy: EnergyMeter,
        flops: FlopAccount,
        scaler: torch.amp.GradScaler,
        startup: StartupClock,
    ) -> None:
        self.config = config
        self.precision = precision
        self.device_record = device_record
        self.world = world
        self.metadata = metadata
        self.cuda_graphs = cuda_graphs
        self.steps_per_epoch = steps_per_epoch
        self.global_batch = global_batch
        self.model = model
        self.train_data = train_data
        self.eval_data = eval_data
        self.memory = memory
        self.energy = energy
        self.flops = flops
        self.scaler = scaler
        self.startup = startup

    def hyperparameters(self) -> dict[str, Any]:
        """The config's, with whether this device replayed the steps as a CUDA graph, and the
        subset in effect: a pipeline's is applied where the data is prepared, not here."""
        prepared = self.metadata.get("settings", {}).get("subset", 0)
        subset = min((n for n in (self.config.subset, prepared) if n), default=0)
        return {
            **self.config.hyperparameters(),
            "subset": subset,
            "cuda_graphs": self.cuda_graphs,
        }

    def epoch(
        self,
        epoch: int,
        epoch_time: float,
        train_peak_mb: float,
        train_sums: tuple[float, float, float],
        evaluated: dict[str, tuple[float, float]],
        lr: float,
        loss_scales: list[float] | None = None,
    ) -> EpochRecord:
        """The epoch's record, logged: `train_sums` are (loss sum, correct, skipped steps),
        `evaluated` each split's (loss, accuracy), `loss_scales` fp16's per step."""
        images = self.steps_per_epoch * self.global_batch
        loss_sum, correct, skipped = train_sums
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
            lr=lr,
            # Every arm records both, so that all arms log the same metric names: without
            # a scaler the scale is 1 and nothing is skipped.
            loss_scale=self.scaler.get_scale() if self.precision.grad_scaler else 1.0,
            skipped_steps=int(skipped),
            loss_scales=loss_scales,
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

    def results(
        self,
        state: LoopState,
        warm_up: WarmUpRecord,
        resumed_from: str | None,
        fp16_numerics: Fp16Numerics | None = None,
        profile: Profile | None = None,
    ) -> ArmResults:
        """The arm's results (ampbench/results.py) after the epochs in `state`."""
        config = self.config
        epochs = [EpochRecord(**record) for record in state.history]
        last = epochs[-1]
        trained_images = len(epochs) * self.steps_per_epoch * self.global_batch
        return ArmResults(
            schema_version=RESULTS_SCHEMA_VERSION,
            precision=self.precision.record(),
            device=self.device_record,
            model=config.model,
            parameters=parameter_count(self.model),
            hyperparameters=self.hyperparameters(),
            dataset=self.dataset(),
            accuracy=last.test_accuracy,
            test_loss=last.test_loss,
            timing=self.timing(state, warm_up, trained_images),
            memory=self.memory.record_over_ranks(self.world),
            energy=self.energy.record(state.train_energy_j, state.train_time_s, trained_images),
            fp16_numerics=fp16_numerics,
            profile=profile,
            skipped_steps=sum(e.skipped_steps for e in epochs),
            loss_scale=self.scaler.get_scale() if self.precision.grad_scaler else None,
            resumed_from=resumed_from,
            versions=software_versions(),
            epochs=epochs,
            compute=self.flops.compute(len(epochs) * self.steps_per_epoch, state.train_time_s),
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

    def dataset(self) -> DatasetRecord:
        dataset = self.metadata
        return DatasetRecord(
            path=str(self.config.dataset_dir),
            source=dataset["source"]["spec"],
            sha256=dataset["source"]["sha256"],
            classes=len(dataset["classes"]),
            image_shape=list(dataset["image_shape"]),
            train_images=len(self.train_data),
            test_images=len(self.eval_data["test"]),
            cached_from=dataset["source"].get("cached_from"),
        )

    def timing(self, state: LoopState, warm_up: WarmUpRecord, trained_images: int) -> Timing:
        return Timing(
            train_time_s=state.train_time_s,
            throughput_img_s=trained_images / state.train_time_s,
            trained_images=trained_images,
            end_to_end_s=(
                warm_up.seconds + state.train_time_s + state.eval_time_s + state.checkpoint_time_s
            ),
            warmup_s=warm_up.seconds,
            warmup_steps=self.config.warmup_steps,
            compile_s=warm_up.compile_s,
            compile_cache=warm_up.compile_cache,
            eval_s=state.eval_time_s,
            checkpoint_s=state.checkpoint_time_s,
            startup=self.startup.record(),
        )
