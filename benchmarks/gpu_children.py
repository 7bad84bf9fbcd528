"""gpu_benchmark.py's children: one engine arm and seed (train_one_arm), or a batch size's
bare-loop arms (bare_loop), each in a fresh process that gpu_benchmark.py starts, with their
torch.profiler recordings (--profile)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ampbench.errors import AmpbenchError

CANNOT_RUN_HERE = 3  # a child's exit status when the device has no native math for the arm
# The bare loop's (warm-up, timed) steps, as the H200 measurement's bare_loop_gpu.py ran them.
BARE_STEPS = {"cuda": (20, 100), "cpu": (1, 3)}
PROFILE_STEPS = {"cuda": 50, "cpu": 2}
# Timed engine steps the profile waits for after the warm-up's (the CPU smoke trains 4).
ENGINE_PROFILE_TIMED_WAIT = {"cuda": 2, "cpu": 0}


def write_profile(profiler: Any, directory: Path, name: str, device_type: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    profiler.export_chrome_trace(str(directory / f"{name}.trace.json"))
    sort = "self_device_time_total" if device_type == "cuda" else "self_cpu_time_total"
    averages = profiler.key_averages().table(sort_by=sort, row_limit=40)
    (directory / f"{name}.txt").write_text(averages + "\n")


def profiler_activities(device_type: str) -> list[Any]:
    from torch.profiler import ProfilerActivity

    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device_type == "cuda" else [])


@contextlib.contextmanager
def engine_profile(
    directory: Path | None, name: str, device_type: str, warmup_steps: int
) -> Iterator[None]:
    """torch.profiler over PROFILE_STEPS of the engine's timed steps (after its warm-up's
    `warmup_steps`, undone, and those of ENGINE_PROFILE_TIMED_WAIT). The engine is not
    changed for it: a step is counted at each optimizer step, or each CUDA graph replay where
    the engine replays its step as one."""
    if directory is None:
        yield
        return
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.profiler import profile, schedule

    steps = PROFILE_STEPS[device_type]
    wait = warmup_steps + ENGINE_PROFILE_TIMED_WAIT[device_type]
    written: list[bool] = []

    def ready(profiler: Any) -> None:
        write_profile(profiler, directory, name, device_type)
        written.append(True)

    profiler = profile(
        activities=profiler_activities(device_type),
        schedule=schedule(wait=wait, warmup=1, active=steps, repeat=1),
        on_trace_ready=ready,
    )
    replay = torch.cuda.CUDAGraph.replay

    def counted_replay(graph: torch.cuda.CUDAGraph) -> None:
        replay(graph)
        profiler.step()

    hook = register_optimizer_step_post_hook(lambda *_: profiler.step())
    torch.cuda.CUDAGraph.replay = counted_replay  # type: ignore[method-assign]
    try:
        with profiler:
            yield
    finally:
        hook.remove()
        torch.cuda.CUDAGraph.replay = replay  # type: ignore[method-assign]
    if not written:
        print(
            f"{name}: no profile: the run ended before {wait + 1 + steps} steps",
            file=sys.stderr,
        )


def train_one_arm(args: argparse.Namespace) -> int:
    """The child: one arm and seed, in this fresh process, results written as JSON."""
    from ampbench.results import write_json as write_results
    from ampbench.train.config import TrainConfig
    from ampbench.train.device import pick_device
    from ampbench.train.loop import train
    from ampbench.train.precision import resolve

    config = TrainConfig(
        dataset_dir=args.dataset, precision=args.precision, epochs=args.epochs,
        batch_size=args.batch_size, seed=args.seed, model=args.model, compile=args.compile,
        device=args.device, allow_emulated=args.allow_emulated, lr=args.lr,
        warmup_steps=args.warmup_steps, profile_steps=args.profile_steps,
    )  # fmt: skip
    try:  # an arm this device cannot run natively is skipped; any other error is a failure
        resolve(config.precision, pick_device(config.device), config.allow_emulated)
    except AmpbenchError as error:
        print(f"{error}", file=sys.stderr)
        return CANNOT_RUN_HERE
    name = f"engine-{args.precision}-b{args.batch_size}-s{args.seed}"
    try:
        device_type = pick_device(config.device).type
        with engine_profile(args.profile, name, device_type, config.warmup_steps):
            results, _ = train(config)
    except AmpbenchError as error:
        print(f"{error}", file=sys.stderr)
        return 1
    write_results(args.arm_results, results)
    return 0


def bare_loop(args: argparse.Namespace) -> int:
    """The child of a batch size's bare-loop arms: one process for all its precisions (a
    process per precision would spend a third of the GPU check starting up),
    each one's images/s, or why it cannot run here, as a JSON line in args.bare_results."""
    from ampbench.dataset_format import read_metadata
    from ampbench.train.device import pick_device
    from ampbench.train.precision import resolve

    device = pick_device(args.device)
    metadata = read_metadata(args.dataset)
    lines = []
    for name in args.precision.split(","):
        try:
            precision = resolve(name, device, args.allow_emulated)
        except AmpbenchError as error:
            lines.append({"precision": name, "cannot_run": str(error)})
            continue
        lines.append(bare_arm(args, device, precision, metadata))
    args.bare_results.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return 0


def bare_step(args: argparse.Namespace, device: Any, precision: Any,
              metadata: dict[str, Any]) -> Callable[[], None]:  # fmt: skip
    """One training step of the bare loop: the model, optimizer and a batch already on the
    device, the engine's optimizer settings."""
    import torch
    from torch import nn

    from ampbench.train.config import TrainConfig, model_input_shape
    from ampbench.train.fp8 import convert_for_fp8
    from ampbench.train.models import build_model

    shape = model_input_shape(metadata["image_shape"])
    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = True  # as the engine sets it outside --deterministic
    model = build_model(args.model, len(metadata["classes"]), shape)
    model = model.to(device, memory_format=torch.channels_last)
    if precision.fp8_recipe is not None:
        convert_for_fp8(model, precision.fp8_recipe, precision.emulated, model_name=args.model)
    defaults = TrainConfig(dataset_dir=args.dataset)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=args.lr, momentum=defaults.momentum, nesterov=True,
        weight_decay=defaults.weight_decay,
    )  # fmt: skip
    scaler = torch.amp.GradScaler(device.type, enabled=precision.grad_scaler)
    images = torch.randn(args.batch_size, *shape, device=device)
    images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, len(metadata["classes"]), (args.batch_size,), device=device)

    def step() -> None:
        with precision.autocast():
            loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    return step


def bare_arm(args: argparse.Namespace, device: Any, precision: Any,
             metadata: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """One precision's bare loop, timed (and profiled with --profile)."""
    import torch

    from ampbench.train.precision import math_mode

    step = bare_step(args, device, precision, metadata)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    warmup, steps = BARE_STEPS[device.type]
    with math_mode(precision):
        started = time.perf_counter()
        for _ in range(warmup):
            step()
        sync()
        timed = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        seconds = time.perf_counter() - timed
        if args.profile is not None:
            from torch.profiler import profile

            with profile(activities=profiler_activities(device.type)) as profiler:
                for _ in range(PROFILE_STEPS[device.type]):
                    step()
                sync()
            name = f"bare-{precision.requested}-b{args.batch_size}-s{args.seed}"
            write_profile(profiler, args.profile, name, device.type)
    return {
        "precision": precision.requested,
        "resolved": precision.name,
        "emulated": precision.emulated,
        "model": args.model,
        "batch_size": args.batch_size,
        "device": str(device),
        "warmup_steps": warmup,
        "warmup_s": timed - started,
        "steps": steps,
        "seconds": seconds,
        "ms_per_step": seconds / steps * 1e3,
        "images_per_s": args.batch_size * steps / seconds,
    }
