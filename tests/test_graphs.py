"""The CUDA-graph step's logic where it needs no GPU: when the step is captured, the static
buffers every step goes through, the in-place state a graph relies on, and the refusals.
The capture and replay themselves run in tests/test_gpu.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ampbench.errors import AmpbenchError
from ampbench.train.config import TrainConfig
from ampbench.train.graphs import StepInputs, StepRunner, settle_cuda_graphs
from ampbench.train.loop import Trainer
from ampbench.train.memory import MemoryMeter
from ampbench.train.record import evaluate
from ampbench.world import SINGLE_PROCESS, World

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


def inputs(value: int) -> StepInputs:
    return StepInputs(
        torch.full((4,), value), torch.full((2, 4), value), torch.full((4,), value % 2 == 1)
    )


def test_each_step_sees_its_own_inputs_through_the_same_static_buffers() -> None:
    seen: list[tuple[int, int]] = []

    def step(static: StepInputs) -> None:
        seen.append((int(static.rows[0]), static.rows.data_ptr()))

    runner = StepRunner(step)
    for value in (3, 5, 8):
        runner(inputs(value))
    assert [value for value, _ in seen] == [3, 5, 8]
    assert len({address for _, address in seen}) == 1  # a graph replays one set of addresses


def test_a_step_is_captured_only_after_it_ran() -> None:
    with pytest.raises(RuntimeError, match="has not run before its capture"):
        StepRunner(lambda _: None).capture()


@pytest.mark.parametrize(
    ("requested", "device", "world", "expected"),
    [
        (True, CUDA, SINGLE_PROCESS, (True, "on")),
        (False, CUDA, SINGLE_PROCESS, (False, "off (--no-cuda-graphs)")),
        (True, CPU, SINGLE_PROCESS, (False, "off: they need a CUDA device, not cpu")),
        (
            True,
            CUDA,
            World(rank=1, local_rank=1, size=2),
            (False, "off under torchrun: DDP's gradient all-reduce is not captured here"),
        ),
    ],
)
def test_where_the_step_is_captured(
    requested: bool, device: torch.device, world: World, expected: tuple[bool, str]
) -> None:
    assert settle_cuda_graphs(requested, device, world, 3, compile_model=False) == expected


def test_a_capture_without_a_warm_up_is_refused_in_one_line() -> None:
    with pytest.raises(AmpbenchError) as raised:
        settle_cuda_graphs(True, CUDA, SINGLE_PROCESS, 0, compile_model=False)
    assert str(raised.value) == (
        "--warmup-steps 0 with --cuda-graphs: the step is captured after the warm-up has chosen "
        "its kernels; give at least one warm-up step or --no-cuda-graphs"
    )
    # Eager training needs no warm-up step.
    assert settle_cuda_graphs(False, CUDA, SINGLE_PROCESS, 0, compile_model=False)[0] is False


def small(dataset: Path, **overrides: object) -> TrainConfig:
    settings: dict[str, object] = {
        "dataset_dir": dataset, "precision": "fp32", "model": "small-cnn", "epochs": 2,
        "batch_size": 20, "subset": 100, "lr": 0.05, "device": "cpu", "deterministic": True,
    }  # fmt: skip
    return TrainConfig(**{**settings, **overrides})  # type: ignore[arg-type]


def test_the_state_a_graph_holds_is_changed_in_place_only(synthetic_dataset: Path) -> None:
    """A captured graph reads and writes fixed addresses: the counters and the learning rate
    must be the same tensors after the warm-up's undo, every step and the epochs' resets, or
    replays would update tensors nobody reads."""
    trainer = Trainer(small(synthetic_dataset))
    counters = trainer.counters.state()
    results = trainer.run()
    assert len(results.epochs) == 2 and trainer.run_step.static is not None
    assert all(trainer.counters.state()[name] is tensor for name, tensor in counters.items())
    assert all(group["lr"] is trainer.lr for group in trainer.optimizer.param_groups)
    # The learning rate the graph reads is the schedule's, step by step.
    epochs = results.epochs
    last_step = 2 * trainer.steps_per_epoch - 1
    assert epochs[-1].lr == pytest.approx(0.05 * trainer.schedule(last_step))
    assert float(trainer.lr) == pytest.approx(epochs[-1].lr, rel=1e-6)


def test_results_record_whether_the_steps_were_captured(synthetic_dataset: Path) -> None:
    trainer = Trainer(small(synthetic_dataset, epochs=1))
    results = trainer.run()
    # On a CPU the default (on) does not apply: the results, and the MLflow params made from
    # the same record, say what ran.
    assert trainer.config.cuda_graphs is True
    assert results.hyperparameters["cuda_graphs"] is False
    assert trainer.hyperparameters() == results.hyperparameters
    # The evaluation batch is the training batch (recorded as 0: a matrix's batch-size
    # groups must not differ in it).
    assert results.hyperparameters["eval_batch_size"] == 0 and trainer.eval_batch_size == 20


def test_evaluation_is_the_same_whatever_its_batch_and_padding(synthetic_dataset: Path) -> None:
    """Every evaluation batch is padded to one shape with blank images that count in neither
    loss nor accuracy: the figures are those of unpadded evaluation."""
    trainer = Trainer(small(synthetic_dataset, subset=37))
    test = trainer.eval_data["test"]
    reference = evaluate(trainer.model, test, trainer.precision, len(test))
    for eval_batch in (1, 7, 16, 64):
        loss, accuracy = evaluate(trainer.model, test, trainer.precision, eval_batch)
        assert loss == pytest.approx(reference[0], rel=1e-5), eval_batch
        assert accuracy == reference[1], eval_batch


def test_a_step_that_cannot_be_captured_is_refused_in_one_line(
    synthetic_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = Trainer(small(synthetic_dataset, precision="bf16", allow_emulated=True))

    def failing_capture() -> None:
        raise RuntimeError("operation not permitted when stream is capturing\nCUDA kernel errors")

    monkeypatch.setattr(trainer.run_step, "capture", failing_capture)
    # What the capture does before it on a GPU, a no-op here.
    monkeypatch.setattr(torch.cuda, "synchronize", lambda _device: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    with pytest.raises(AmpbenchError) as raised:
        trainer.capture()
    assert str(raised.value) == (
        "--cuda-graphs: the training step of small-cnn in bf16 cannot be captured as a CUDA "
        "graph (operation not permitted when stream is capturing); train it with "
        "--no-cuda-graphs"
    )


def test_a_captured_steps_peak_counts_in_every_later_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Replays allocate nothing the allocator's statistics see: the capture's peak stands for
    every window after it. The process's memory readings are simulated, so that what the
    kernel happens to report (or a peak mark it cannot reset) decides nothing."""
    mib = 2.0**20
    readings = {"VmRSS": 100 * mib, "VmHWM": 100 * mib}
    monkeypatch.setattr(MemoryMeter, "_status_bytes", staticmethod(readings.__getitem__))

    def reset_mark(_meter: MemoryMeter) -> None:  # what writing clear_refs does
        readings["VmHWM"] = readings["VmRSS"]

    monkeypatch.setattr(MemoryMeter, "_reset_device_peak", reset_mark)
    meter = MemoryMeter(CPU)
    meter.start()
    meter.mark_resident()  # 100 MiB resident
    readings["VmHWM"] = 164 * mib  # the capture's peak: 64 MiB above the resident mark
    meter.hold_step_peak()
    readings["VmHWM"] = readings["VmRSS"] = 100 * mib  # replays: no new allocation seen
    meter.reset_peak()
    assert meter.window_peak_mb() == 64
    assert meter.record().train_peak_mb == 64
