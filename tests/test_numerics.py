"""The numerics of fp16: the loss scale of every step recorded from inside the step, and once per
fp16 arm the gradient elements fp16 would flush to zero unscaled and overflow once scaled."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from torch import nn

from ampbench.train.config import TrainConfig
from ampbench.train.numerics import fp16_numerics
from ampbench.train.precision import Precision, resolve

CPU = torch.device("cpu")


def fp16() -> Precision:
    return resolve("fp16", CPU, allow_emulated=True)


class Weights(nn.Module):
    """Elementwise weights (no autocast op): each weight's gradient is its input."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(2))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return (self.weight * inputs).sum()


def test_tiny_gradients_flush_to_zero_and_large_ones_overflow() -> None:
    """Two weights: one whose gradient (1e-9) is below fp16's smallest subnormal, one whose
    gradient (1.0) overflows fp16 once scaled by 2**17."""
    inputs = torch.tensor([1e-9, 1.0])
    found = fp16_numerics(Weights(), lambda model: model(inputs), fp16(), 2.0**17)
    assert found.gradient_elements == 2
    assert found.underflow_share == pytest.approx(0.5)
    assert found.overflow_share == pytest.approx(0.5)
    assert found.scaled_loss == pytest.approx(found.loss * 2.0**17)
    # At a scale of 1 nothing overflows; the small gradient still vanishes.
    found = fp16_numerics(Weights(), lambda model: model(inputs), fp16(), 1.0)
    assert (found.underflow_share, found.overflow_share) == (0.5, 0.0)


@pytest.mark.usefixtures("tiny_model")
def test_an_fp16_arm_records_its_scale_per_step_and_its_numerics(synthetic_dataset: Path) -> None:
    from ampbench.train.loop import Trainer

    config = TrainConfig(
        dataset_dir=synthetic_dataset,
        precision="fp16",
        model="small-cnn",
        device="cpu",
        epochs=2,
        batch_size=50,
        subset=400,
        allow_emulated=True,
        initial_loss_scale=2.0**20,
    )
    trainer = Trainer(config)
    results = trainer.run()
    for epoch in results.epochs:
        assert epoch.loss_scales is not None
        assert len(epoch.loss_scales) == trainer.steps_per_epoch
        assert all(scale > 0 for scale in epoch.loss_scales)
    scales = [scale for epoch in results.epochs for scale in epoch.loss_scales or []]
    assert scales[0] == 2.0**20  # the first step trains at the initial scale
    # The scaler halves the scale exactly after a skipped step (and grows it only after 2,000
    # good ones): the trajectory and the final scale account for every skip.
    halvings = sum(after < before for before, after in itertools.pairwise(scales))
    last_skipped = results.loss_scale is not None and results.loss_scale < scales[-1]
    assert halvings + last_skipped == results.skipped_steps > 0
    numerics = results.fp16_numerics
    assert numerics is not None and numerics.gradient_elements > 0
    assert 0 <= numerics.underflow_share <= 1 and 0 <= numerics.overflow_share <= 1
    assert numerics.loss_scale == results.loss_scale
    # Measured off the clock with the model put back: a second measurement changes nothing.
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.measure_fp16_numerics()
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.usefixtures("tiny_model")
def test_arms_without_a_scaler_record_no_scales(synthetic_dataset: Path) -> None:
    from ampbench.train.loop import train

    results, _ = train(
        TrainConfig(
            dataset_dir=synthetic_dataset,
            precision="fp32",
            model="small-cnn",
            device="cpu",
            epochs=1,
            batch_size=50,
            subset=200,
        )
    )
    assert results.epochs[0].loss_scales is None and results.fp16_numerics is None
