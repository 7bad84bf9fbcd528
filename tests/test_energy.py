"""Energy per arm from a fake powercap tree: the figures are the counter's differences, across a
wrap too; zones that are not packages, or cannot be read, are left out; without a counter the
figure is absent and says why; a trained arm records what its counter moved while the clock ran."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from ampbench.train.config import TrainConfig
from ampbench.train.energy import (
    POWERCAP_DIR_ENV,
    RESOLVED_UPDATES,
    EnergyMeter,
    RaplCounter,
    find_counter,
    rapl_zones,
)
from ampbench.world import SINGLE_PROCESS

CPU = torch.device("cpu")
RANGE_UJ = 1_000_000_000  # the zone's counter wraps here (1 kJ)


def zone(root: Path, name: str, energy_uj: int, max_range_uj: int = RANGE_UJ) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "name").write_text(f"{name}\n")
    (path / "energy_uj").write_text(f"{energy_uj}\n")
    (path / "max_energy_range_uj").write_text(f"{max_range_uj}\n")
    return path


def set_counter(path: Path, energy_uj: int) -> None:
    """As sysfs changes it: a reader sees the old value or the new one, never a partial file."""
    partial = path / "energy_uj.partial"
    partial.write_text(f"{energy_uj}\n")
    partial.replace(path / "energy_uj")


@pytest.fixture
def powercap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A powercap tree of two packages and a sub-zone, pointed to by the setting."""
    root = tmp_path / "powercap"
    zone(root, "intel-rapl:0", 5_000_000)
    zone(root, "intel-rapl:1", 7_000_000)
    zone(root, "intel-rapl:0:0", 1_000_000)  # the cores of package 0: counted in it already
    monkeypatch.setenv(POWERCAP_DIR_ENV, str(root))
    return root


def test_the_counter_s_differences_are_the_joules_across_a_wrap(powercap: Path) -> None:
    counter = RaplCounter(rapl_zones(powercap))
    assert counter.joules() == 0.0
    set_counter(powercap / "intel-rapl:0", 8_000_000)  # +3 J
    set_counter(powercap / "intel-rapl:1", 7_500_000)  # +0.5 J
    assert counter.joules() == pytest.approx(3.5)
    # Package 1 wraps: from 7.5 J to 0.25 J past the 1 kJ range is 992.75 J.
    set_counter(powercap / "intel-rapl:1", 250_000)
    assert counter.joules() == pytest.approx(3.5 + (RANGE_UJ - 7_500_000 + 250_000) / 1e6)


def test_only_readable_package_zones_are_counted(powercap: Path) -> None:
    (powercap / "intel-rapl:1" / "energy_uj").write_text("not a number\n")
    zone(powercap, "intel-rapl-mmio:0", 1)  # another driver's zone, not a package
    assert [path.name for path in rapl_zones(powercap)] == ["intel-rapl:0"]


def test_without_a_counter_the_figure_is_absent_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(POWERCAP_DIR_ENV, str(tmp_path / "none"))
    counter, reason = find_counter(CPU)
    assert counter is None
    assert reason.startswith("no energy counter on this device")
    assert str(tmp_path / "none") in reason
    energy = EnergyMeter(CPU, SINGLE_PROCESS).record(0.0, 10.0, 100)
    assert (energy.counter, energy.train_j, energy.j_per_image) == (None, None, None)
    assert energy.unavailable == reason


def test_the_meter_sums_the_clock_s_stretches_and_the_whole_window(powercap: Path) -> None:
    package = powercap / "intel-rapl:0"
    meter = EnergyMeter(CPU, SINGLE_PROCESS)
    meter.begin()
    set_counter(package, 6_000_000)  # warm-up: 1 J, outside the clock
    train_j = 0.0
    meter.open()
    set_counter(package, 9_000_000)  # 3 J on the clock
    train_j += meter.close()
    set_counter(package, 10_000_000)  # evaluation: 1 J, outside
    meter.open()
    set_counter(package, 12_000_000)  # 2 J on the clock
    train_j += meter.close()
    assert train_j == pytest.approx(5.0)
    energy = meter.record(train_j, train_time_s=10.0, trained_images=1000)
    assert energy.counter == "rapl"
    assert energy.train_j == pytest.approx(5.0)
    assert energy.end_to_end_j == pytest.approx(7.0)
    assert energy.j_per_image == pytest.approx(0.005)
    assert energy.reliable is True
    assert energy.devices == 1


def test_a_window_too_short_for_the_counter_is_marked_unreliable(powercap: Path) -> None:
    meter = EnergyMeter(CPU, SINGLE_PROCESS)
    meter.begin()
    for _ in range(3):
        meter.open()
        meter.close()
    assert meter.counter is not None
    shortest = RESOLVED_UPDATES * 3 * meter.counter.update_s
    assert meter.record(1.0, shortest, 10).reliable is True
    assert meter.record(1.0, shortest * 0.9, 10).reliable is False


@pytest.mark.usefixtures("tiny_model")
def test_a_trained_arm_records_what_its_counter_moved(
    synthetic_dataset: Path, powercap: Path
) -> None:
    """A thread drives package 0 at 1 J a millisecond; the arm's training energy is what the
    counter moved while the clock ran: more than nothing, less than the whole run's."""
    from ampbench.train.loop import train

    package = powercap / "intel-rapl:0"
    stop = threading.Event()
    written = [5_000_000]

    def drive() -> None:
        while not stop.wait(0.001):
            written[0] += 1_000_000
            set_counter(package, written[0])

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    try:
        results, _ = train(
            TrainConfig(
                dataset_dir=synthetic_dataset,
                precision="fp32",
                model="small-cnn",
                device="cpu",
                epochs=2,
                batch_size=32,
            )
        )
    finally:
        stop.set()
        driver.join()
    energy = results.energy
    assert energy is not None and energy.counter == "rapl"
    assert energy.train_j is not None and energy.end_to_end_j is not None
    moved_j = (written[0] - 5_000_000) / 1e6
    assert 0 < energy.train_j < energy.end_to_end_j <= moved_j
    assert energy.j_per_image == pytest.approx(energy.train_j / results.timing.trained_images)
