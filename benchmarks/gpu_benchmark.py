"""Benchmark: the full experiment (CIFAR-10, ResNet-18, 2 epochs) in every precision arm.

Strict fp32, amp (fp16 with GradScaler on CUDA), bf16 and tf32, at batch 128 and 512. Every
arm and seed trains in a process of its own, through the engine's one measurement protocol -
the code the pipeline's train step runs: precision resolved first, an untimed warm-up per arm,
memory read per process. Then each batch size's arms are compared with strict fp32 by the
compare step's own code: the RESULTS block, a table of steady-state speedup, end-to-end time
ratio, memory ratio and accuracy delta with their intervals, and the verdict. All of it is
written as JSON.

Beside each engine arm, a bare-loop arm, one process for a batch size's (--no-bare: none): the same
model (ampbench's build_model), batch and precision (autocast dtype, GradScaler for fp16 only,
the engine's TF32 switches, channels_last, SGD with Nesterov momentum, cudnn.benchmark), on
random images already on the device, WARM-UP untimed steps then STEPS timed ones: the floor
any engine has on this device. Its images/s and the engine's over it are printed per
precision and written to the JSON. --profile DIR records 50 steps of each arm with
torch.profiler (a Chrome trace and a key_averages table per arm): the bare loop's after its
timed steps, the engine's inside its timed steps (counted by optimizer steps or CUDA graph
replays), so the engine's figures in such a run carry the profiler's cost.

It needs ampbench installed and the CIFAR-10 archive (simplejpeg speeds up decoding):

    python benchmarks/gpu_benchmark.py --data cifar10-jpeg.tar.gz --seeds 0,1 --json gpu.json
    python benchmarks/gpu_benchmark.py --device cpu   # smoke test: small-cnn, tiny subset
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Its own folder only (for common.py), never the checkout's root, whose ampbench/ lacks the
# steps: the installed package is the one measured (gpu_check.sh runs with PYTHONSAFEPATH=1).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import archive_argument, table, write_json

from ampbench import schema
from ampbench.compare.analysis import compare_arms
from ampbench.compare.report import render_text, tables
from ampbench.errors import AmpbenchError
from ampbench.results import ArmResults, read_arm_results
from ampbench.train import BASELINE_PRECISION
from ampbench.train.config import TrainConfig

# 4 steps of 16: a bf16 arm without native bf16 runs at a tenth of fp32's speed.
CPU_SMOKE = {
    "subset": 64,
    "epochs": 1,
    "precisions": "fp32,bf16",
    "batch_sizes": "16",
    "model": "small-cnn",
}
CANNOT_RUN_HERE = 3  # a child's exit status when the device has no native math for the arm
# The bare loop's (warm-up, timed) steps, as the H200 measurement's bare_loop_gpu.py ran them.
BARE_STEPS = {"cuda": (20, 100), "cpu": (1, 3)}
PROFILE_STEPS = {"cuda": 50, "cpu": 2}
# Engine steps before its profile starts: the 3-step warm-up (undone), and on a GPU a few
# timed ones (the CPU smoke trains 4 steps in all).
ENGINE_PROFILE_WAIT = {"cuda": 5, "cpu": 3}


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
def engine_profile(directory: Path | None, name: str, device_type: str) -> Iterator[None]:
    """torch.profiler over PROFILE_STEPS of the engine's timed steps. The engine is not
    changed for it: a step is counted at each optimizer step, or each CUDA graph replay where
    the engine replays its step as one."""
    if directory is None:
        yield
        return
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.profiler import profile, schedule

    steps, wait = PROFILE_STEPS[device_type], ENGINE_PROFILE_WAIT[device_type]
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
    )  # fmt: skip
    try:  # an arm this device cannot run natively is skipped; any other error is a failure
        resolve(config.precision, pick_device(config.device), config.allow_emulated)
    except AmpbenchError as error:
        print(f"{error}", file=sys.stderr)
        return CANNOT_RUN_HERE
    name = f"engine-{args.precision}-b{args.batch_size}-s{args.seed}"
    try:
        with engine_profile(args.profile, name, pick_device(config.device).type):
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


def bare_arm(args: argparse.Namespace, device: Any, precision: Any,
             metadata: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """One precision's bare loop: the model, optimizer and a batch already on the device."""
    import torch
    from torch import nn

    from ampbench.train.config import TrainConfig, model_input_shape
    from ampbench.train.fp8 import convert_for_fp8
    from ampbench.train.models import build_model
    from ampbench.train.precision import math_mode

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


def run_child(args: argparse.Namespace, kind: str, out: Path, dataset: Path, precision: str,
              batch: int, seed: int) -> str | None:  # fmt: skip
    """Run one arm and seed in a child process (`kind`: --arm-results for the engine,
    --bare-results for the bare loop): None, or why it could not run here (raises ArmFailed
    if it failed for any other reason)."""
    command = [
        sys.executable, __file__, kind, str(out), "--dataset", str(dataset),
        "--precision", precision, "--batch-size", str(batch), "--seed", str(seed),
        "--epochs", str(args.epochs), "--model", args.model, "--device", args.device,
        "--lr", str(args.lr),
    ]  # fmt: skip
    command += ["--compile"] if args.compile else []
    command += ["--allow-emulated"] if args.allow_emulated else []
    command += ["--profile", str(args.profile)] if args.profile else []
    done = subprocess.run(command, stderr=subprocess.PIPE, text=True)
    if done.returncode == CANNOT_RUN_HERE:
        return done.stderr.strip().splitlines()[-1]
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-5000:])
        what = "bare-loop arm" if kind == "--bare-results" else "arm"
        raise ArmFailed(f"the {precision} {what} (batch {batch}, seed {seed}) failed")
    return None


def run_arm(args: argparse.Namespace, dataset: Path, precision: str, batch: int, seed: int,
            out: Path) -> ArmResults | str:  # fmt: skip
    """Train one arm and seed in a child process: its results, or why it could not run."""
    why = run_child(args, "--arm-results", out, dataset, precision, batch, seed)
    return why if why is not None else read_arm_results(out)


def run_bare(args: argparse.Namespace, dataset: Path, precisions: list[str], batch: int,
             seed: int, out: Path) -> list[dict[str, Any]]:  # fmt: skip
    """The bare loops of a batch size's precisions in one child process: each one's figures,
    or {"precision", "cannot_run": why}."""
    run_child(args, "--bare-results", out, dataset, ",".join(precisions), batch, seed)
    return [json.loads(line) for line in out.read_text().splitlines()]


def engine_over_bare(
    runs: dict[str, list[ArmResults]], bare: dict[str, dict[str, Any]]
) -> dict[str, dict[str, float]]:
    """Per precision: the engine's images/s (median over seeds), the bare loop's, and their
    ratio."""
    ratios = {}
    for precision, loop in bare.items():
        if precision not in runs:
            continue
        engine = statistics.median(arm.timing.throughput_img_s for arm in runs[precision])
        ratios[precision] = {
            "engine_img_s": engine,
            "bare_img_s": loop["images_per_s"],
            "engine_over_bare": engine / loop["images_per_s"],
        }
    return ratios


class ArmFailed(Exception):
    """An arm that could run here but did not finish (diverged, crashed)."""


def run_bare_arms(args: argparse.Namespace, dataset: Path, precisions: list[str], batch: int,
                  seed: int, tmp: Path, bare: dict[int, dict[str, dict[str, Any]]],
                  failed: list[str]) -> None:  # fmt: skip
    """The bare loops beside a batch size's engine arms: recorded in `bare` (and --bare-arms),
    or in `failed`."""
    try:
        loops = run_bare(args, dataset, precisions, batch, seed, tmp / f"bare-b{batch}.jsonl")
    except ArmFailed as error:
        failed.append(str(error))
        print(f"FAILED: {error}", flush=True)
        return
    for loop in loops:
        precision = loop["precision"]
        if "cannot_run" in loop:  # its engine arm ran, so this is not the device: report it
            failed.append(
                f"the {precision} bare-loop arm (batch {batch}) could not run: {loop['cannot_run']}"
            )
            continue
        bare[batch][precision] = loop
        if args.bare_arms:
            with args.bare_arms.open("a") as bare_file:
                bare_file.write(json.dumps(loop) + "\n")
        print(
            f"{precision} batch {batch} bare loop: {loop['images_per_s']:,.0f} images/s "
            f"({loop['ms_per_step']:.2f} ms/step, warm-up {loop['warmup_s']:.1f} s)",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    archive_argument(parser)
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (smoke)")
    parser.add_argument("--precisions", help="default fp32,amp,bf16,tf32 (cpu: fp32,bf16)")
    parser.add_argument("--batch-sizes", help="default 128,512 (cpu: 32)")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    parser.add_argument("--epochs", type=int, help="default 2 (cpu: 1)")
    parser.add_argument("--subset", type=int, help="images per split; default all (cpu: 128)")
    parser.add_argument("--model", help="default resnet18 (cpu: small-cnn)")
    parser.add_argument(
        "--lr", type=float, default=TrainConfig.lr, help="peak learning rate (vit-s: 0.02)"
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile (in the warm-up)")
    parser.add_argument(
        "--allow-emulated",
        action="store_true",
        help="measure precisions the device has no native math for (cpu smoke: always)",
    )
    parser.add_argument(
        "--bare",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a bare-loop arm beside each engine arm, and engine / bare per precision",
    )
    parser.add_argument(
        "--bare-arms", type=Path, help="append each bare-loop arm here as it finishes (JSON lines)"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="write a torch.profiler trace and table of 50 steps of each arm into this folder",
    )
    parser.add_argument("--json", type=Path, help="write the comparisons here as JSON")
    parser.add_argument(
        "--arms",
        type=Path,
        help="append each arm's results here as it finishes (JSON lines): kept if the run "
        "is cut short",
    )
    # The child's own arguments (one arm and seed in a fresh process):
    parser.add_argument("--arm-results", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--bare-results", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--dataset", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--precision", help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm_results is not None:
        sys.exit(train_one_arm(args))
    if args.bare_results is not None:
        sys.exit(bare_loop(args))

    smoke = args.device == "cpu"
    args.epochs = args.epochs or (CPU_SMOKE["epochs"] if smoke else 2)
    args.model = args.model or (CPU_SMOKE["model"] if smoke else "resnet18")
    # The smoke test checks the script, not the CPU: an emulated bf16 arm is labelled so.
    args.allow_emulated = args.allow_emulated or smoke
    precisions = args.precisions or (CPU_SMOKE["precisions"] if smoke else "fp32,amp,bf16,tf32")
    # The baseline first.
    precisions = sorted(precisions.split(","), key=lambda p: p != BASELINE_PRECISION)
    sizes = args.batch_sizes or (CPU_SMOKE["batch_sizes"] if smoke else "128,512")
    batch_sizes = [int(b) for b in sizes.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    subset = args.subset if args.subset is not None else (CPU_SMOKE["subset"] if smoke else 0)
    if not args.data.is_file():
        sys.exit(f"gpu_benchmark: {args.data}: no such archive (pass --data)")

    from ampbench.data import SourceOptions, prepare_dataset

    started = time.perf_counter()
    runs: dict[int, dict[str, list[ArmResults]]] = {b: {} for b in batch_sizes}
    bare: dict[int, dict[str, dict[str, Any]]] = {b: {} for b in batch_sizes}
    skipped: dict[str, str] = {}
    failed: list[str] = []
    for path in (args.arms, args.bare_arms):
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")
    with tempfile.TemporaryDirectory() as tmp:
        dataset = Path(tmp) / "cifar10"
        prepare_dataset(
            str(args.data), dataset, subset=subset, options=SourceOptions(cache_dir=Path(tmp))
        )
        print(f"prepared {args.data.name} in {time.perf_counter() - started:.1f} s", flush=True)
        # Seeds outermost, arms interleaved: drift over the run (clocks, heat) hits all arms.
        for seed in seeds:
            for batch in batch_sizes:
                for precision in precisions:
                    if precision in skipped:
                        continue
                    arm_started = time.perf_counter()
                    out = Path(tmp) / f"{precision}-b{batch}-s{seed}.json"
                    try:
                        outcome = run_arm(args, dataset, precision, batch, seed, out)
                    except ArmFailed as error:
                        failed.append(str(error))
                        print(f"FAILED: {error}", flush=True)
                        continue
                    if isinstance(outcome, str):
                        skipped[precision] = outcome
                        print(f"skipped {precision}: {outcome}", flush=True)
                        continue
                    runs[batch].setdefault(precision, []).append(outcome)
                    if args.arms:
                        with args.arms.open("a") as arms_file:
                            arms_file.write(json.dumps(schema.dump(outcome)) + "\n")
                    print(
                        f"{precision} batch {batch} seed {seed}: "
                        f"{outcome.timing.throughput_img_s:,.0f} images/s, "
                        f"{outcome.timing.train_time_s:.2f} s training, accuracy "
                        f"{outcome.accuracy:.4f} ({time.perf_counter() - arm_started:.0f} s)",
                        flush=True,
                    )
                # One bare loop per batch and precision (it has no seed-dependent work),
                # all of a batch size's in one process, after its engine arms.
                ran = [p for p in precisions if p in runs[batch] and p not in bare[batch]]
                if args.bare and ran:
                    run_bare_arms(args, dataset, ran, batch, seed, Path(tmp), bare, failed)
    comparisons = {}
    ratios = {}
    for batch, arms in runs.items():
        try:
            comparison = compare_arms(arms, baseline=BASELINE_PRECISION)
        except AmpbenchError as error:
            print(f"\nbatch {batch}: no comparison ({error})")
            continue
        comparisons[str(batch)] = schema.dump(comparison)
        print(f"\n===== batch {batch} =====")
        print(render_text(comparison))
        header, rows = tables(comparison)["Against fp32"]
        print()
        print(table(header, rows))
        if bare[batch]:
            ratios[str(batch)] = engine_over_bare(arms, bare[batch])
            print()
            print(table(
                ["precision", "engine images/s", "bare images/s", "engine / bare"],
                [[precision, f"{r['engine_img_s']:,.0f}", f"{r['bare_img_s']:,.0f}",
                  round(r["engine_over_bare"], 2)] for precision, r in ratios[str(batch)].items()],
            ))  # fmt: skip
    total = time.perf_counter() - started
    print(f"\n{args.model}, {args.epochs} epochs, seeds {args.seeds}, total {total:.0f} s")
    write_json(
        args.json,
        {
            "model": args.model,
            "epochs": args.epochs,
            "subset": subset,
            "seeds": seeds,
            "skipped": skipped,
            "failed": failed,
            "total_s": total,
            "comparisons": comparisons,
            "bare": {str(b): loops for b, loops in bare.items() if loops},
            "engine_over_bare": ratios,
            "profile": str(args.profile) if args.profile else None,
        },
    )
    if failed:
        sys.exit(f"gpu_benchmark: {len(failed)} arm(s) failed: {'; '.join(failed)}")
    if not comparisons:
        sys.exit("gpu_benchmark: no batch size had an arm to compare with fp32")


if __name__ == "__main__":
    main()
