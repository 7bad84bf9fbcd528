"""Benchmark: CIFAR training throughput on the CPU, batch 128, three loops, fp32 and bf16.

- bare:  forward, backward, SGD on one resident batch (channels_last) - the ceiling
- engine: ampbench's own epoch loop (device-resident uint8 data, on-device augmentation,
          normalisation, device-side accounting), warm-up steps excluded as in its results
- seed:  the "seed-style" loop: torchvision ImageFolder + DataLoader with PIL transforms
         (random crop with padding 4, flip, ToTensor, Normalize), NCHW, 2 workers

Each in fp32 and bf16 (autocast); images/s is the median over repeats, the three loops
interleaved in each repeat so that machine noise hits all alike. Prints the ratios
engine/bare (goal >= 0.95), bf16/fp32 (goal >= 2.4 for ResNet-18 on an AMX CPU) and
engine/seed. The model is the CIFAR ResNet-18 unless `--model` names another, as the train
step takes it (`--model vit-s --lr 0.02`: the ViT, whose time is in matmuls).

    python benchmarks/train_cpu.py [--data ARCHIVE] [--model NAME] [--lr LR] [--steps 20]
        [--repeats 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torchvision
from common import archive_argument, median, require_archive, shrink_evaluation, table, write_json
from torch import nn
from torchvision import transforms

from ampbench.data import SourceOptions, prepare_dataset
from ampbench.errors import AmpbenchError
from ampbench.train.config import TrainConfig
from ampbench.train.loop import Trainer
from ampbench.train.models import build_model
from ampbench.train.precision import (
    cpu_capability,
    cpu_name,
    cpu_native_features,
    resolve,
)

BATCH = 128
WARMUP = TrainConfig.warmup_steps  # the engine's own untimed warm-up, applied to every loop


@dataclass(frozen=True)
class Workload:
    model: str
    lr: float


def timed_steps(
    model: nn.Module,
    next_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    precision: str,
    steps: int,
    lr: float,
) -> float:
    """Images/s of `steps` plain training steps after WARMUP untimed ones, with the engine's
    optimizer settings and the precision's autocast (the registry's, as the engine has it)."""
    optimizer = torch.optim.SGD(
        model.parameters(), lr=lr, momentum=TrainConfig.momentum, nesterov=True,
        weight_decay=TrainConfig.weight_decay,
    )  # fmt: skip
    autocast = resolve(precision, torch.device("cpu"), allow_emulated=True).autocast
    for step in range(WARMUP + steps):
        if step == WARMUP:
            started = time.perf_counter()
        images, labels = next_batch()
        with autocast():
            loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return steps * BATCH / (time.perf_counter() - started)


def bare(workload: Workload, precision: str, steps: int) -> float:
    torch.manual_seed(0)
    model = build_model(workload.model, 10).to(memory_format=torch.channels_last)
    images = torch.randn(BATCH, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (BATCH,))
    return timed_steps(model, lambda: (images, labels), precision, steps, workload.lr)


def engine(workload: Workload, precision: str, dataset: Path) -> float:
    trainer = Trainer(
        TrainConfig(
            dataset_dir=dataset, precision=precision, epochs=1, batch_size=BATCH, device="cpu",
            model=workload.model, lr=workload.lr,
            allow_emulated=True,  # the header says whether this CPU's bf16 is native
        )
    )  # fmt: skip
    shrink_evaluation(trainer)
    return trainer.run().timing.throughput_img_s


def seed_style(
    workload: Workload,
    precision: str,
    steps: int,
    image_folder: Path,
    mean: list[float],
    std: list[float],
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
    model = build_model(workload.model, 10)
    return timed_steps(model, lambda: next(batches), precision, steps, workload.lr)


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


def measure(args: argparse.Namespace, workload: Workload) -> dict[tuple[str, str], list[float]]:
    """Images/s of each loop (bare, engine, seed) and precision, args.repeats times, the
    loops' order rotated each repeat."""
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
            "bare": lambda p: bare(workload, p, args.steps),
            "engine": lambda p: engine(workload, p, dataset),
            "seed": lambda p: seed_style(
                workload, p, args.steps, folder, metadata["mean"], metadata["std"]
            ),
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
    return samples


def report(args: argparse.Namespace, samples: dict[tuple[str, str], list[float]]) -> None:
    """Each loop's median images/s per precision, their ratios against the goals, and the
    JSON (--json)."""
    rates = {key: median(values) for key, values in samples.items()}
    rows = []
    for name in dict.fromkeys(name for name, _ in rates):
        fp32, bf16 = rates[(name, "fp32")], rates[(name, "bf16")]
        rows.append([name, fp32, bf16, bf16 / fp32])
    threads = torch.get_num_threads()
    bf16 = resolve("bf16", torch.device("cpu"), allow_emulated=True)
    print(
        f"\nCIFAR-10, {args.model}, batch {BATCH}, lr {args.lr}, {threads} threads,"
        f" median of {args.repeats}"
    )
    print(f"CPU: {cpu_name()} ({cpu_capability()}); bf16 {bf16.support}")
    print(table(["loop", "fp32 images/s", "bf16 images/s", "bf16/fp32"], rows))
    ratios = {
        "engine/bare fp32": rates[("engine", "fp32")] / rates[("bare", "fp32")],
        "engine/bare bf16": rates[("engine", "bf16")] / rates[("bare", "bf16")],
        "engine bf16/fp32": rates[("engine", "bf16")] / rates[("engine", "fp32")],
        "engine/seed fp32": rates[("engine", "fp32")] / rates[("seed", "fp32")],
        "engine/seed bf16": rates[("engine", "bf16")] / rates[("seed", "bf16")],
    }
    goals = {"engine/bare fp32": 0.95, "engine/bare bf16": 0.95}
    if args.model == "resnet18" and cpu_native_features().get("AMX-BF16"):
        goals["engine bf16/fp32"] = 2.4  # what AMX buys ResNet-18; no goal elsewhere
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
            "model": args.model,
            "lr": args.lr,
            "cpu": f"{cpu_name()} ({cpu_capability()}); bf16 {bf16.support}",
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    archive_argument(parser)
    parser.add_argument("--model", default="resnet18", help="a model as --model takes it")
    parser.add_argument(
        "--lr", type=float, default=TrainConfig.lr, help="peak learning rate (vit-s: 0.02)"
    )
    parser.add_argument("--steps", type=int, default=20, help="timed steps per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    require_archive(args.data)
    try:  # a setting the train step would refuse is one line, before any work
        TrainConfig(Path(), model=args.model, lr=args.lr).validate()
        build_model(args.model, 10)
    except AmpbenchError as error:
        sys.exit(f"train_cpu: {error}")
    samples = measure(args, Workload(args.model, args.lr))
    report(args, samples)


if __name__ == "__main__":
    main()
