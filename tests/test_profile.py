"""The profile of an arm: K more steps off the clock, undone so that no figure changes; its
shares, its top ops, autocast's coverage by dtype, and a Chrome trace that parses; and nothing
foreign (profiler, energy counter, MLflow) while steps are timed."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from ampbench.results import ArmResults
from ampbench.train.config import TrainConfig
from ampbench.train.loop import Trainer


def config(dataset: Path, precision: str = "fp32", profile_steps: int = 4) -> TrainConfig:
    return TrainConfig(
        dataset_dir=dataset,
        precision=precision,
        model="small-cnn",
        device="cpu",
        epochs=2,
        batch_size=50,
        subset=300,
        profile_steps=profile_steps,
        allow_emulated=True,  # bf16 on any CPU: what is checked is the dtype, not the speed
    )


def trained(configured: TrainConfig, trace: Path | None = None) -> tuple[ArmResults, Trainer]:
    trainer = Trainer(configured)
    trainer.trace_path = trace
    return trainer.run(), trainer


@pytest.mark.usefixtures("tiny_model")
def test_the_profile_is_undone_no_figure_or_weight_changes(synthetic_dataset: Path) -> None:
    plain, plain_trainer = trained(config(synthetic_dataset, profile_steps=0))
    profiled, profiled_trainer = trained(config(synthetic_dataset, profile_steps=5))
    assert plain.profile is None and profiled.profile is not None
    assert profiled.accuracy == plain.accuracy
    assert [e.train_loss for e in profiled.epochs] == [e.train_loss for e in plain.epochs]
    assert [e.test_loss for e in profiled.epochs] == [e.test_loss for e in plain.epochs]
    assert profiled.timing.trained_images == plain.timing.trained_images
    after, before = profiled_trainer.model.state_dict(), plain_trainer.model.state_dict()
    assert all(torch.equal(after[name], before[name]) for name in before)
    assert profiled_trainer.state.global_step == plain_trainer.state.global_step


@pytest.mark.usefixtures("tiny_model")
def test_the_profile_s_figures_and_its_trace(synthetic_dataset: Path, tmp_path: Path) -> None:
    results, _ = trained(config(synthetic_dataset), tmp_path / "trace.json.gz")
    profile = results.profile
    assert profile is not None and profile.steps == 4 and not profile.replayed
    assert 0 < profile.device_busy_share <= 1
    assert 0 < profile.matmul_conv_share < 1  # convolutions, and the rest
    assert profile.tensor_core_share is None  # not CUDA
    assert any("conv" in op.name for op in profile.top_ops)
    assert sum(op.share for op in profile.top_ops) <= 1 + 1e-9
    assert set(profile.flops_by_dtype) == {"float32"}
    assert profile.low_precision_flop_share is None  # fp32: no low dtype to cover
    assert profile.trace == "trace.json.gz"
    with gzip.open(tmp_path / "trace.json.gz") as trace:
        events = json.load(trace)["traceEvents"]
    names = {event.get("name", "") for event in events}
    assert any(name.startswith("aten::") for name in names)


@pytest.mark.usefixtures("tiny_model")
def test_autocast_coverage_counts_the_flops_by_dtype(synthetic_dataset: Path) -> None:
    results, _ = trained(config(synthetic_dataset, "bf16"))
    profile = results.profile
    assert profile is not None
    # Every convolution and the classifier run under autocast in bf16: all FLOPs are low.
    assert set(profile.flops_by_dtype) == {"bfloat16"}
    assert profile.low_precision_flop_share == 1.0
    assert profile.fp32_layers == []


@pytest.mark.usefixtures("tiny_model")
def test_a_layer_autocast_leaves_in_fp32_is_named(
    synthetic_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The classifier forced to fp32 (autocast disabled around it) shows in the coverage."""
    from torch import nn

    original = nn.Linear.forward

    def in_fp32(self: nn.Linear, inputs: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", enabled=False):
            return original(self, inputs.float())

    monkeypatch.setattr(nn.Linear, "forward", in_fp32)
    results, trainer = trained(config(synthetic_dataset, "bf16"))
    profile = results.profile
    assert profile is not None and profile.low_precision_flop_share is not None
    assert 0 < profile.low_precision_flop_share < 1
    linears = [n for n, m in trainer.model.named_modules() if isinstance(m, nn.Linear)]
    assert profile.fp32_layers == linears


@pytest.mark.usefixtures("tiny_model")
def test_nothing_foreign_runs_between_timed_steps(
    synthetic_dataset: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Between the first and the last timed step of every stretch of the clock: no profiler,
    no energy-counter read, no MLflow call (the profile, the counter and MLflow each ran, just
    not there)."""
    import torch.profiler
    from mlflow import MlflowClient

    from ampbench.train import energy
    from ampbench.train.energy import RaplCounter
    from ampbench.train.step import run_training
    from ampbench.train.tracker import TrackingOptions

    root = tmp_path / "powercap" / "intel-rapl:0"
    root.mkdir(parents=True)
    (root / "energy_uj").write_text("1000\n")
    (root / "max_energy_range_uj").write_text("1000000000\n")
    monkeypatch.setenv(energy.POWERCAP_DIR_ENV, str(root.parent))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    events: list[str] = []

    def spy(owner: Any, name: str, event: str) -> None:
        original = getattr(owner, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            events.append(event)
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapped)

    spy(RaplCounter, "joules", "energy")
    spy(torch.profiler.profile, "__enter__", "profiler")
    for method in ("log_batch", "create_run", "set_terminated", "log_artifact"):
        spy(MlflowClient, method, "mlflow")
    original_timed = Trainer.timed_steps

    def timed(self: Trainer, *args: Any) -> float:
        events.append("clock starts")
        try:
            return original_timed(self, *args)
        finally:
            events.append("clock stops")

    original_step = Trainer.take_step

    def step(self: Trainer, *args: Any) -> None:
        events.append("step")
        original_step(self, *args)

    monkeypatch.setattr(Trainer, "timed_steps", timed)
    monkeypatch.setattr(Trainer, "take_step", step)
    results = run_training(
        config(synthetic_dataset),
        tmp_path / "results.json",
        tmp_path / "model.pt",
        TrackingOptions(experiment="nothing-foreign"),
        trace_path=tmp_path / "trace",  # as KFP names the output
    )
    assert results.mlflow is not None and results.mlflow.run_id is not None
    logged = MlflowClient().list_artifacts(results.mlflow.run_id, "profile")
    assert [artifact.path for artifact in logged] == ["profile/trace.json.gz"]
    assert {"energy", "profiler", "mlflow"} <= set(events)
    stretches = 0
    while "clock starts" in events:
        start = events.index("clock starts")
        stop = events.index("clock stops")
        inside = events[start + 1 : stop]
        first, last = inside.index("step"), len(inside) - inside[::-1].index("step")
        assert set(inside[first:last]) == {"step"}, inside[first:last]
        events = events[stop + 1 :]
        stretches += 1
    assert stretches == 2  # one per epoch
