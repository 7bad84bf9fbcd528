"""The training engine's guarantees: determinism, checkpoints that survive SIGKILL, divergence
caught and named, fp16 loss-scale skips counted, compilation timed apart."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch
from children import ChildOutput, assert_resumed_mid_epoch, wait_for_checkpoint

from ampbench.errors import AmpbenchError
from ampbench.results import ArmResults
from ampbench.train import arm, checkpoint, device
from ampbench.train.config import TrainConfig
from ampbench.train.flops import train_step_flops
from ampbench.train.loop import Trainer, train
from ampbench.train.optim import build_optimizer

TIMING_KEYS = {"time_s", "throughput_img_s", "train_peak_memory_mb"}


def metrics_only(results: ArmResults | dict[str, Any]) -> list[dict[str, Any]]:
    """The per-epoch learning metrics, without wall-clock or memory readings."""
    epochs = results["epochs"] if isinstance(results, dict) else map(asdict, results.epochs)
    return [{k: v for k, v in epoch.items() if k not in TIMING_KEYS} for epoch in epochs]


def small_config(dataset: Path, **overrides: Any) -> TrainConfig:
    settings: dict[str, Any] = {
        "dataset_dir": dataset,
        "precision": "fp32",
        "model": "small-cnn",
        "epochs": 2,
        "batch_size": 50,
        "subset": 200,
        "device": "cpu",
        "deterministic": True,
    }
    return TrainConfig(**{**settings, **overrides})


@pytest.mark.usefixtures("tiny_model")
def test_same_seed_gives_bitwise_identical_metrics(synthetic_dataset: Path) -> None:
    first, model_a = train(small_config(synthetic_dataset, seed=3))
    second, model_b = train(small_config(synthetic_dataset, seed=3))
    other, _ = train(small_config(synthetic_dataset, seed=4))
    assert metrics_only(first) == metrics_only(second)
    for (name, a), b in zip(
        model_a.state_dict().items(), model_b.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    assert metrics_only(first) != metrics_only(other)


# `ampbench -v` logs each checkpoint it has written (rank 0 alone, under torchrun).
def ampbench_train(
    dataset: Path, out: Path, *extra: str, verbose: bool = False
) -> subprocess.Popen[str]:
    command = [
        sys.executable, "-m", "ampbench.cli", *(["-v"] if verbose else []), "train",
        "--dataset", str(dataset),
        "--precision", "fp32", "--model", "small-cnn", "--epochs", "2", "--batch-size", "20",
        "--subset", "400", "--deterministic", "--no-tracking", "--output-dir", str(out), *extra,
    ]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_sigkill_mid_epoch_then_resume_ends_like_an_uninterrupted_run(
    synthetic_dataset: Path, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "checkpoints"
    args = ("--checkpoint-dir", str(checkpoints), "--checkpoint-every", "7")
    victim = ampbench_train(synthetic_dataset, tmp_path / "killed", *args, verbose=True)
    # Kill once its log says the first mid-epoch checkpoint (step 7 of 20 per epoch: 400
    # images, batch 20) is written.
    first = wait_for_checkpoint(ChildOutput(victim))
    assert first.parent == checkpoints
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    assert not (tmp_path / "killed" / "results.json").exists()
    assert list(checkpoints.glob("ckpt-*.pt"))

    resumed = ampbench_train(synthetic_dataset, tmp_path / "resumed", *args, "--resume")
    output = resumed.communicate(timeout=600)[0]
    assert resumed.returncode == 0, output
    assert_resumed_mid_epoch(output)
    uninterrupted = ampbench_train(synthetic_dataset, tmp_path / "whole")
    output = uninterrupted.communicate(timeout=600)[0]
    assert uninterrupted.returncode == 0, output

    after_kill = json.loads((tmp_path / "resumed" / "results.json").read_text())
    whole = json.loads((tmp_path / "whole" / "results.json").read_text())
    assert after_kill["resumed_from"] is not None
    assert metrics_only(after_kill) == metrics_only(whole)
    assert after_kill["accuracy"] == whole["accuracy"]
    # Every checkpoint loads with weights_only=True: nothing in it is unpickled as code.
    kept = sorted(checkpoints.glob("ckpt-*.pt"))
    assert len(kept) == 3  # --keep-checkpoints defaults to 3
    state = torch.load(kept[-1], weights_only=True)
    assert {"model", "optimizer", "scaler", "rng", "loop"} <= set(state)
    assert state["loop"]["epoch"] == 2


@pytest.mark.usefixtures("tiny_model")
def test_checkpoints_of_an_earlier_run_need_resume(synthetic_dataset: Path, tmp_path: Path) -> None:
    directory = str(tmp_path / "ckpt")
    train(small_config(synthetic_dataset, epochs=1, checkpoint_dir=directory))
    with pytest.raises(AmpbenchError, match="holds checkpoints of an earlier run; pass --resume"):
        train(small_config(synthetic_dataset, epochs=1, checkpoint_dir=directory))


def test_unreadable_checkpoint_is_one_line(synthetic_dataset: Path, tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    directory.mkdir()
    (directory / "ckpt-000000004.pt").write_bytes(b"not a checkpoint at all")
    config = small_config(synthetic_dataset, epochs=1, checkpoint_dir=str(directory), resume=True)
    with pytest.raises(AmpbenchError, match=r"ckpt-000000004\.pt: not a readable checkpoint"):
        train(config)
    # A pickle that would run code is refused by weights_only=True, and said so in one line.
    torch.save({"fingerprint": {}, "loop": Exploit()}, directory / "ckpt-000000008.pt")
    with pytest.raises(AmpbenchError, match=r"ckpt-000000008\.pt: not a readable checkpoint"):
        train(config)


class Exploit:
    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, ("echo pwned",))


@pytest.mark.usefixtures("tiny_model")
def test_resume_refuses_a_checkpoint_of_another_run(
    synthetic_dataset: Path, tmp_path: Path
) -> None:
    directory = str(tmp_path / "ckpt")
    train(small_config(synthetic_dataset, epochs=1, checkpoint_dir=directory))
    with pytest.raises(AmpbenchError, match="belongs to a different run"):
        train(
            small_config(
                synthetic_dataset, epochs=1, lr=0.05, checkpoint_dir=directory, resume=True
            )
        )


def test_divergence_stops_with_the_step_named(synthetic_dataset: Path) -> None:
    with pytest.raises(
        AmpbenchError, match=r"loss became NaN or inf at step \d+ \(epoch 1, fp32\)"
    ):
        train(small_config(synthetic_dataset, lr=1e12, epochs=1))


@pytest.mark.usefixtures("tiny_model")
def test_fp16_skipped_steps_are_counted(synthetic_dataset: Path) -> None:
    # fp16 (autocast float16 + GradScaler) on the CPU, emulated on most CPUs: the same code as
    # on CUDA. A loss scale of 2^20 overflows fp16 gradients: the scaler skips and halves
    # until it fits.
    config = small_config(
        synthetic_dataset, precision="fp16", allow_emulated=True, initial_loss_scale=2.0**20,
        epochs=1, batch_size=10, subset=100,
    )  # fmt: skip
    results, _ = train(config)
    assert results.precision.grad_scaler is True
    skipped = results.skipped_steps
    assert 1 <= skipped < 10
    assert skipped == results.epochs[0].skipped_steps
    # Each skipped step halves the scale (and 10 steps are too few for it to grow back); the
    # warm-up's skips were undone with the rest of its state.
    assert results.loss_scale == 2.0**20 / 2**skipped


def test_a_skipped_first_step_leaves_the_fused_optimizer_sound() -> None:
    """Fused SGD (the engine's on CUDA; it runs on a CPU too) after an fp16 step that the
    GradScaler skips: the same weights as stock SGD, not uninitialised momentum."""
    config = TrainConfig(dataset_dir=Path("."), lr=0.1)
    weights = {}
    for fused in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 10)
        optimizer = build_optimizer(model, config, torch.tensor(config.lr), fused=fused)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
        inputs, labels = torch.randn(32, 64), torch.randint(0, 10, (32,))
        for step in range(3):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(inputs), labels)
            scaler.scale(loss * (float("inf") if step == 0 else 1.0)).backward()
            scaler.step(optimizer)
            scaler.update()
        weights[fused] = model.weight.detach()
    assert torch.isfinite(weights[True]).all() and weights[True].abs().max() < 1
    torch.testing.assert_close(weights[True], weights[False])


@pytest.mark.usefixtures("tiny_model")
def test_fp16_skipping_every_step_stops(synthetic_dataset: Path) -> None:
    config = small_config(
        synthetic_dataset,
        precision="fp16",
        allow_emulated=True,
        initial_loss_scale=2.0**60,
        max_skipped_steps=5,
        epochs=1,
        batch_size=10,
        subset=60,
        warmup_steps=1,
    )
    with pytest.raises(AmpbenchError, match=r"skipped \d+ steps in a row"):
        train(config)


def test_compilation_happens_in_the_warm_up_not_the_clock(
    synthetic_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Inductor's code generation takes a minute on two CPU cores; AOT autograd without it
    # traces and compiles the same graphs, which is what the warm-up must hold.
    compile_function = torch.compile
    monkeypatch.setattr(
        torch, "compile", lambda model, **kw: compile_function(model, backend="aot_eager", **kw)
    )
    results, _ = train(small_config(synthetic_dataset, compile=True, epochs=1, deterministic=False))
    timing = results.timing
    assert 0 < timing.compile_s <= timing.warmup_s
    assert timing.train_time_s == pytest.approx(sum(e.time_s for e in results.epochs))
    assert results.hyperparameters["compile"] is True


@pytest.mark.usefixtures("tiny_model")
def test_the_warm_up_leaves_the_training_trajectory_unchanged(synthetic_dataset: Path) -> None:
    """Warmed-up and cold runs end bitwise alike."""
    settings = {"batch_size": 20, "subset": 100}
    warm, warm_model = train(small_config(synthetic_dataset, warmup_steps=4, **settings))
    cold, cold_model = train(small_config(synthetic_dataset, warmup_steps=0, **settings))
    assert warm.timing.warmup_steps == 4 and warm.timing.warmup_s > 0
    assert cold.timing.warmup_s == 0
    assert metrics_only(warm) == metrics_only(cold)
    for (name, a), b in zip(
        warm_model.state_dict().items(), cold_model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name


@pytest.mark.usefixtures("tiny_model")
def test_the_warm_up_puts_back_everything_a_step_changes(synthetic_dataset: Path) -> None:
    """fp16 (emulated here) moves the most state: the GradScaler's scale and growth tracker,
    momentum buffers, the schedule, BatchNorm statistics, the skip counters, the RNG."""
    trainer = Trainer(
        small_config(
            synthetic_dataset, precision="fp16", allow_emulated=True, batch_size=10,
            subset=50, initial_loss_scale=2.0**24, warmup_steps=2,
        )
    )  # fmt: skip
    before = copy.deepcopy(trainer.training_state())
    scales_seen = []
    step = trainer.train_step

    def recording_step(*args: Any) -> None:
        step(*args)
        scales_seen.append(trainer.scaler.get_scale())

    trainer.train_step = recording_step  # type: ignore[method-assign]
    trainer.warm_up(trainer.model)
    after = trainer.training_state()
    assert after["scaler"] == before["scaler"]
    assert after["optimizer"]["param_groups"] == before["optimizer"]["param_groups"]
    for index, state in before["optimizer"]["state"].items():  # zero momentum, as made
        assert torch.equal(
            after["optimizer"]["state"][index]["momentum_buffer"], state["momentum_buffer"]
        )
        assert not state["momentum_buffer"].any()
    for part in ("model", "counters"):
        for name, value in before[part].items():
            assert torch.equal(after[part][name], value), (part, name)
    assert torch.equal(after["rng"]["torch"], before["rng"]["torch"])
    # ...and the steps did run: the scale overflowed and the scaler moved, then was put back.
    assert scales_seen == [2.0**23, 2.0**22] and trainer.scaler.get_scale() == 2.0**24


@pytest.mark.usefixtures("tiny_model")
def test_one_time_costs_land_in_the_warm_up_not_in_the_training_time(
    synthetic_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first step that costs 100 s (as cuDNN autotuning or lazy loading would) is paid by the
    warm-up; without a warm-up it would be training time. The 100 s pass on the engine's clock
    only, so that the test does not depend on how busy the CPU it shares is."""
    from ampbench.train import loop

    original = Trainer.train_step
    real_clock = time.perf_counter
    calls = []
    skipped = [0.0]

    def slow_first_step(self: Trainer, *args: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            skipped[0] += 100.0
        original(self, *args)

    monkeypatch.setattr(Trainer, "train_step", slow_first_step)
    monkeypatch.setattr(loop.time, "perf_counter", lambda: real_clock() + skipped[0])
    warm, _ = train(small_config(synthetic_dataset, epochs=1, batch_size=50, subset=100))
    assert warm.timing.warmup_s >= 100.0 and warm.timing.train_time_s < 100.0
    assert warm.timing.end_to_end_s > warm.timing.train_time_s + 100.0
    calls.clear()
    cold, _ = train(
        small_config(synthetic_dataset, epochs=1, batch_size=50, subset=100, warmup_steps=0)
    )
    assert cold.timing.train_time_s >= 100.0


MEMORY_PHASES = """
import json, sys
import torch
from ampbench.train.memory import MemoryMeter

def mib(size):
    return torch.ones(size * 2**20 // 4)  # touched: resident

sizes = json.loads(sys.argv[1])
earlier = mib(sizes["earlier"])  # work done before the run: must not count in it
del earlier
meter = MemoryMeter(torch.device("cpu"))
meter.start()
resident = mib(sizes["resident"])  # the "data set"
meter.mark_resident()
meter.reset_peak()
transient = mib(sizes["train"])  # the "activations" of a step
del transient
train_peak = meter.window_peak_mb()
meter.reset_peak()  # an "evaluation" window: counts in the total, not in training
evaluation = mib(sizes["evaluation"])
del evaluation
record = meter.record()
print(json.dumps({"kind": record.kind, "resident": record.resident_mb, "window": train_peak,
                  "train": record.train_peak_mb, "total": record.total_peak_mb}))
"""


def test_memory_meter_sees_the_resident_data_a_training_peak_and_the_total() -> None:
    """Large allocations (the C library maps and unmaps them whole) move the resident set by
    their size: the meter's windows must see exactly that. Measured in a fresh process, whose
    resident set and peak mark nothing else moves (this one's hold what earlier tests left);
    what came before the meter's start (a larger allocation, freed) is no part of any figure."""
    sizes = {"earlier": 500, "resident": 200, "train": 100, "evaluation": 150}  # MiB
    done = subprocess.run(
        [sys.executable, "-c", MEMORY_PHASES, json.dumps(sizes)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    reading = json.loads(done.stdout)
    assert reading["kind"] == "cpu_rss"

    def about(value: float, mib: float) -> bool:
        # A few pages of the interpreter's own, and 2 % of the allocation: far less than a
        # unit of 10^6 bytes would move it (4.9 %), or a window that saw another phase.
        return abs(value - mib) <= 2 + 0.02 * mib

    assert about(reading["resident"], sizes["resident"]), reading
    assert about(reading["window"], sizes["train"]), reading
    assert reading["train"] == pytest.approx(reading["window"])
    total = sizes["resident"] + max(sizes["train"], sizes["evaluation"])
    assert about(reading["total"], total), reading  # resident + the largest window above it


@pytest.mark.usefixtures("tiny_model")
def test_nothing_else_runs_in_this_process_while_steps_are_timed(
    synthetic_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tracked in MLflow, the run is created before the clock and no thread but this one and
    the system-metrics sampler (a few /proc reads every 10 s, never a call to MLflow) is alive
    during timed steps (MLflow sends between epochs)."""
    from mlflow import MlflowClient

    from ampbench.train.step import run_training
    from ampbench.train.tracker import TrackingOptions

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    original_run, original_step = Trainer.run, Trainer.train_step
    runs_at_start: list[Any] = []
    threads_during_steps: set[str] = set()

    def run(self: Trainer) -> ArmResults:
        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name("before-the-clock")
        runs_at_start.extend(client.search_runs([experiment.experiment_id]) if experiment else [])
        return original_run(self)

    def step(self: Trainer, *args: Any) -> None:
        threads_during_steps.update(t.name for t in threading.enumerate())
        original_step(self, *args)

    monkeypatch.setattr(Trainer, "run", run)
    monkeypatch.setattr(Trainer, "train_step", step)
    threads_before = {t.name for t in threading.enumerate()}
    run_training(
        small_config(synthetic_dataset, epochs=2, batch_size=50, subset=100),
        tmp_path / "results.json",
        tmp_path / "model.pt",
        TrackingOptions(experiment="before-the-clock"),
    )
    (created,) = runs_at_start
    assert created.data.params["batch_size"] == "50" and created.data.tags["ampbench.seed"]
    assert "system-metrics" in threads_during_steps
    allowed = threads_before | {"system-metrics"}
    assert threads_during_steps <= allowed, threads_during_steps - allowed


@pytest.mark.usefixtures("tiny_model")
def test_a_checkpoint_that_cannot_be_saved_does_not_end_the_training(
    synthetic_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    def unreachable_store(*args: Any) -> str:
        raise AmpbenchError("s3://bucket/ckpt: cannot reach the S3 endpoint")

    monkeypatch.setattr(checkpoint, "save", unreachable_store)
    config = small_config(
        synthetic_dataset, epochs=1, subset=100, checkpoint_dir=str(tmp_path / "ckpt")
    )
    results, _ = train(config)
    assert results.timing.trained_images == 100
    warnings = [r.getMessage() for r in caplog.records if "not saved" in r.getMessage()]
    assert warnings, "the lost checkpoint went unreported"


def test_target_accuracy_stops_at_the_first_epoch_that_reaches_it(
    synthetic_dataset: Path,
) -> None:
    """MLPerf's rule: evaluate each epoch, stop at the first that reaches the target, and
    record the training time up to there; a target never reached runs every epoch."""
    never, _ = train(small_config(synthetic_dataset, epochs=3, target_accuracy=1.0))
    accuracies = [epoch.test_accuracy for epoch in never.epochs]
    assert max(accuracies) < 1.0, "the data must leave a target that no epoch reaches"
    missed = never.time_to_target
    assert missed is not None and not missed.reached
    assert missed.train_time_s is None and missed.epoch is None

    target = accuracies[1]  # reached by epoch 2 at the latest: the run stops before epoch 3
    first = next(index for index, accuracy in enumerate(accuracies) if accuracy >= target)
    stopped, _ = train(small_config(synthetic_dataset, epochs=3, target_accuracy=target))
    assert metrics_only(stopped) == metrics_only(never)[: first + 1]
    reached = stopped.time_to_target
    assert reached is not None and reached.reached and reached.epoch == first + 1
    assert reached.target_accuracy == target
    assert reached.train_time_s == stopped.timing.train_time_s > 0


@pytest.mark.usefixtures("tiny_model")
def test_achieved_flops_are_the_counted_step_flops_over_the_training_time(
    synthetic_dataset: Path,
) -> None:
    results, _ = train(small_config(synthetic_dataset, epochs=1))
    compute = results.compute
    assert compute is not None and compute.flops_per_step > 0
    steps = results.timing.trained_images // 50
    expected = compute.flops_per_step * steps / results.timing.train_time_s / 1e12
    assert compute.achieved_tflops == pytest.approx(expected)
    assert compute.peak_tflops is None and compute.mfu is None  # no CPU's peak is known
    assert results.time_to_target is None  # no --target-accuracy


@pytest.mark.usefixtures("tiny_model")
def test_the_step_flops_counted_in_the_warm_up_are_those_of_a_step_of_their_own(
    synthetic_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted in the first warm-up step (the eager model of one process trains it), or, with
    no warm-up, in a step of their own (train_step_flops): one figure either way, and no step
    of their own where the warm-up counts them."""
    steps_of_their_own = []

    def counted_apart(*args: Any, **kwargs: Any) -> int:
        steps_of_their_own.append(1)
        return train_step_flops(*args, **kwargs)

    monkeypatch.setattr(arm, "train_step_flops", counted_apart)
    in_warm_up, _ = train(small_config(synthetic_dataset, epochs=1, warmup_steps=2))
    assert not steps_of_their_own
    apart, _ = train(small_config(synthetic_dataset, epochs=1, warmup_steps=0))
    assert len(steps_of_their_own) == 1
    assert in_warm_up.compute is not None and apart.compute is not None
    assert in_warm_up.compute.flops_per_step == apart.compute.flops_per_step > 0


def test_deterministic_algorithms_follow_each_run_in_one_process() -> None:
    # seed_everything skips torch's setter when nothing changes (it imports torch._inductor):
    # a run after a deterministic one must still turn them off.
    try:
        device.seed_everything(0, deterministic=True)
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        device.seed_everything(0, deterministic=False)
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
