"""The training engine's guarantees: determinism, checkpoints that survive SIGKILL, divergence
caught and named, fp16 loss-scale skips counted, compilation timed apart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from ampbench.components.train import engine
from ampbench.components.train.checkpoint import NAME
from ampbench.components.train.config import TrainConfig
from ampbench.components.train.engine import Trainer, train
from ampbench.components.train.precision import Precision
from ampbench.errors import AmpbenchError

TIMING_KEYS = {"time_s", "throughput_img_s", "peak_memory_mb"}


def metrics_only(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-epoch learning metrics, without wall-clock or memory readings."""
    return [{k: v for k, v in epoch.items() if k not in TIMING_KEYS} for epoch in results["epochs"]]


def small_config(dataset: Path, **overrides: Any) -> TrainConfig:
    settings: dict[str, Any] = {
        "dataset_dir": dataset,
        "precision": "fp32",
        "model": "small-cnn",
        "epochs": 2,
        "batch_size": 50,
        "subset": 400,
        "device": "cpu",
        "deterministic": True,
    }
    return TrainConfig(**{**settings, **overrides})


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


def ampbench_train(dataset: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    command = [
        sys.executable, "-m", "ampbench.cli", "train", "--dataset", str(dataset),
        "--precision", "fp32", "--model", "small-cnn", "--epochs", "2", "--batch-size", "20",
        "--deterministic", "--no-tracking", "--output-dir", str(out), *extra,
    ]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_sigkill_mid_epoch_then_resume_ends_like_an_uninterrupted_run(
    synthetic_dataset: Path, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "checkpoints"
    args = ("--checkpoint-dir", str(checkpoints), "--checkpoint-every", "7")
    victim = ampbench_train(synthetic_dataset, tmp_path / "killed", *args)
    # Kill once the first mid-epoch checkpoint (step 7 of 50 per epoch) is on disk.
    deadline = time.monotonic() + 240
    while not any(NAME.match(p.name) for p in checkpoints.glob("ckpt-*.pt")):
        assert victim.poll() is None, f"training ended before a checkpoint:\n{victim.stdout.read()}"  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    assert not (tmp_path / "killed" / "results.json").exists()
    assert list(checkpoints.glob("ckpt-*.pt"))

    resumed = ampbench_train(synthetic_dataset, tmp_path / "resumed", *args, "--resume")
    output = resumed.communicate(timeout=600)[0]
    assert resumed.returncode == 0, output
    assert "resume: " in output
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
    assert {"model", "optimizer", "scheduler", "scaler", "rng", "loop"} <= set(state)
    assert state["loop"]["epoch"] == 2


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


def fp16_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fp16 arm (autocast float16 + GradScaler) on the CPU, which the engine normally
    refuses (no fast fp16 kernels there) but which exercises the same code as on CUDA."""
    fp16 = Precision("fp16", "fp16", "cpu")
    assert fp16.autocast_dtype == torch.float16 and fp16.grad_scaler
    monkeypatch.setattr(engine, "resolve", lambda requested, device: fp16)


def test_fp16_skipped_steps_are_counted(
    synthetic_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp16_on_cpu(monkeypatch)
    # A loss scale of 2^24 overflows fp16 gradients: the scaler skips and halves until it fits.
    # (fp16 kernels are slow on a CPU: small batches keep this test short.)
    config = small_config(
        synthetic_dataset, initial_loss_scale=2.0**24, epochs=1, batch_size=10, subset=200
    )
    results, _ = train(config)
    assert results["grad_scaler"] is True
    skipped = results["skipped_steps"]
    assert 1 <= skipped < 20
    assert skipped == results["epochs"][0]["skipped_steps"]
    # Each skipped step halves the scale (and 20 steps are too few for it to grow back).
    assert results["loss_scale"] == 2.0**24 / 2**skipped


def test_fp16_skipping_every_step_stops(
    synthetic_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp16_on_cpu(monkeypatch)
    config = small_config(
        synthetic_dataset,
        initial_loss_scale=2.0**60,
        max_skipped_steps=5,
        epochs=1,
        batch_size=10,
        subset=120,
    )
    with pytest.raises(AmpbenchError, match=r"skipped \d+ steps in a row"):
        train(config)


def test_compile_time_is_reported_apart(synthetic_dataset: Path) -> None:
    config = small_config(synthetic_dataset, compile=True, epochs=1, deterministic=False)
    trainer = Trainer(config)
    buffers = {name: b.clone() for name, b in trainer.model.named_buffers()}
    trainer.warm_up_compiled(torch.compile(trainer.model))
    # The warm-up leaves the model as it found it (BatchNorm statistics included).
    for name, buffer in trainer.model.named_buffers():
        assert torch.equal(buffer, buffers[name]), name
    results = trainer.run()
    assert results["compile_time_s"] > 0
    assert results["train_time_s"] == pytest.approx(sum(e["time_s"] for e in results["epochs"]))
    assert results["accuracy"] is not None
