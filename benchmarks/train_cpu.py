"""Benchmark: CIFAR ResNet-18 training throughput on the CPU, batch 128, three loops.

- bare:  forward, backward, SGD on one resident batch (channels_last) - the ceiling
- engine: ampbench's own epoch loop (device-resident uint8 data, on-device augmentation,
          normalisation, device-side accounting), warm-up steps excluded as in its results
- seed:  the "seed-style" loop: torchvision ImageFolder + DataLoader with PIL transforms
         (random crop with padding 4, flip, ToTensor, Normalize), NCHW, 2 workers

Each in fp32 and bf16 (autocast); images/s is the median over repeats, the three loops
interleaved in each repeat so that machine noise hits all alike. Prints the ratios
engine/bare (goal >= 0.95), bf16/fp32 (goal >= 2.4) and engine/seed.

    python benchmarks/train_cpu.py [--data ARCHIVE] [--steps 20] [--repeats 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torchvision
from common import archive_argument, median, shrink_evaluation, table, write_json
from torch import nn
from torchvision import transforms

from ampbench.components.prepare import SourceOptions, prepare_dataset
from ampbench.components.train.config import TrainConfig
from ampbench.components.train.engine import Trainer
from ampbench.components.train.models import build_model
from ampbench.components.train.precision import cpu_capability, cpu_name, resolve

BATCH = 128
WARMUP = TrainConfig.warmup_steps  # the engine's own untimed warm-up, applied to every loop


def timed_steps(
    model: nn.Module,
    next_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    precision: str,
    steps: int,
) -> float:
    """Images/s of `steps` plain training steps after WARMUP untimed ones."""
    optimizer = torch.optim.SGD(
        model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4
    )
    for step in range(WARMUP + steps):
        if step == WARMUP:
            started = time.perf_counter()
        images, labels = next_batch()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return steps * BATCH / (time.perf_counter() - started)


def bare(precision: str, steps: int) -> float:
    torch.manual_seed(0)
    model = build_model("resnet18", 10).to(memory_format=torch.channels_last)
    images = torch.randn(BATCH, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (BATCH,))
    return timed_steps(model, lambda: (images, labels), precision, steps)


def engine(precision: str, dataset: Path) -> float:
    trainer = Trainer(
        TrainConfig(
            dataset_dir=dataset, precision=precision, epochs=1, batch_size=BATCH, device="cpu",
            allow_emulated=True,  # the header says whether this CPU's bf16 is native
        )
    )  # fmt: skip
    shrink_evaluation(trainer)
    return trainer.run().timing.throughput_img_s


def seed_style(
    precision: str, steps: int, image_folder: Path, mean: list[float], std: list[float]
) -> float:
    torch.manual_seed(0)
    data = torchvision.datasets.ImageFolder(
        image_folder,
        transform=transforms.Compose(
            [
                transforms.RandomCrop(32, padding=4),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                transforms.Normalize(mean, std),
            ]
        ),
    )
    loader = torch.utils.data.DataLoader(
        data, batch_size=BATCH, shuffle=True, num_workers=2, drop_last=True
    )
    batches = iter(loader)
    return timed_steps(build_model("resnet18", 10), lambda: next(batches), precision, steps)


def extract_train_jpegs(archive: Path, target: Path, per_class: int) -> Path:
    """The first `per_class` training JPEGs of each class, as an ImageFolder tree on disk."""
    taken: dict[str, int] = {}
    with tarfile.open(archive, "r|gz") as tar:
        for member in tar:
            parts = member.name.split("/")
            if not member.isfile() or len(parts) < 4 or parts[-3] != "train":
                continue
            name = parts[-2]
            if taken.get(name, 0) >= per_class:
                continue
            taken[name] = taken.get(name, 0) + 1
            path = target / name / parts[-1]
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = tar.extractfile(member)
            assert handle is not None
            path.write_bytes(handle.read())
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    archive_argument(parser)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not args.data.is_file():
        sys.exit(f"train_cpu: {args.data}: no such archive (pass --data)")
    logging.getLogger("ampbench").setLevel(logging.WARNING)
    images_needed = (WARMUP + args.steps) * BATCH
    with tempfile.TemporaryDirectory() as tmp:
        dataset = Path(tmp) / "prepared"
        metadata = prepare_dataset(
            str(args.data),
            dataset,
            subset=images_needed,
            options=SourceOptions(cache_dir=Path(tmp) / "c"),
        )
        folder = extract_train_jpegs(args.data, Path(tmp) / "jpeg", images_needed // 10 + 1)
        loops: dict[str, Callable[[str], float]] = {
            "bare": lambda p: bare(p, args.steps),
            "engine": lambda p: engine(p, dataset),
            "seed": lambda p: seed_style(p, args.steps, folder, metadata["mean"], metadata["std"]),
        }
        samples: dict[tuple[str, str], list[float]] = {}
        for repeat in range(args.repeats):
            for precision in ("fp32", "bf16"):
                names = list(loops)
                for name in names[repeat % 3 :] + names[: repeat % 3]:
                    rate = loops[name](precision)
                    samples.setdefault((name, precision), []).append(rate)
                    print(
                        f"repeat {repeat + 1}: {name:6} {precision}: {rate:7.1f} images/s",
                        flush=True,
                    )
    rates = {key: median(values) for key, values in samples.items()}
    rows = []
    for name in loops:
        fp32, bf16 = rates[(name, "fp32")], rates[(name, "bf16")]
        rows.append([name, fp32, bf16, bf16 / fp32])
    threads = torch.get_num_threads()
    bf16 = resolve("bf16", torch.device("cpu"), allow_emulated=True)
    print(f"\nCIFAR ResNet-18, batch {BATCH}, {threads} threads, median of {args.repeats}")
    print(f"CPU: {cpu_name()} ({cpu_capability()}); bf16 {bf16.support}")
    print(table(["loop", "fp32 images/s", "bf16 images/s", "bf16/fp32"], rows))
    ratios = {
        "engine/bare fp32": rates[("engine", "fp32")] / rates[("bare", "fp32")],
        "engine/bare bf16": rates[("engine", "bf16")] / rates[("bare", "bf16")],
        "engine bf16/fp32": rates[("engine", "bf16")] / rates[("engine", "fp32")],
        "engine/seed fp32": rates[("engine", "fp32")] / rates[("seed", "fp32")],
        "engine/seed bf16": rates[("engine", "bf16")] / rates[("seed", "bf16")],
    }
    goals = {"engine/bare fp32": 0.95, "engine/bare bf16": 0.95, "engine bf16/fp32": 2.4}
    for name, value in ratios.items():
        goal = goals.get(name)
        verdict = (
            "" if goal is None else f"  (goal >= {goal}: {'met' if value >= goal else 'MISSED'})"
        )
        print(f"{name:18} {value:5.2f}{verdict}")
    write_json(
        args.json,
        {
            "images_per_s": {f"{n}/{p}": v for (n, p), v in rates.items()},
            "samples": {f"{n}/{p}": v for (n, p), v in samples.items()},
            "ratios": ratios,
        },
    )


if __name__ == "__main__":
    main()
