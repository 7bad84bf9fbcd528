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
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Its own folder only (for common.py), never the checkout's root, whose ampbench/ lacks the
# steps: the installed package is the one measured (gpu_check.sh runs with PYTHONSAFEPATH=1).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import archive_argument, require_archive, table, write_json
from gpu_children import CANNOT_RUN_HERE, bare_loop, train_one_arm

from ampbench import schema
from ampbench.argtypes import batch_size_list, precision_list, seed_list
from ampbench.compare.analysis import compare_arms
from ampbench.compare.report import render_text, tables
from ampbench.errors import AmpbenchError
from ampbench.results import ArmResults, read_arm_results
from ampbench.train import AMP_PRECISION, BASELINE_PRECISION
from ampbench.train.config import TrainConfig

# 4 steps of 16: a bf16 arm without native bf16 runs at a tenth of fp32's speed.
CPU_SMOKE = {
    "subset": 64,
    "epochs": 1,
    "precisions": [BASELINE_PRECISION, "bf16"],
    "batch_sizes": [16],
    "model": "small-cnn",
    "warmup_steps": 1,
    "profile_steps": 2,  # the engine's profile after the epochs: its path, not its figures
}
# The full experiment (TrainConfig's) in every precision that has a CUDA arm, at two batches.
FULL_RUN = {
    "subset": 0,  # all
    "epochs": TrainConfig.epochs,
    "precisions": [BASELINE_PRECISION, AMP_PRECISION, "bf16", "tf32"],
    "batch_sizes": [TrainConfig.batch_size, 4 * TrainConfig.batch_size],
    "model": TrainConfig.model,
    "warmup_steps": TrainConfig.warmup_steps,
    "profile_steps": TrainConfig.profile_steps,
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
        "--lr", str(args.lr), "--warmup-steps", str(args.warmup_steps),
        "--profile-steps", str(args.profile_steps),
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


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    archive_argument(parser)
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (smoke)")

    def default(name: str) -> str:
        full, smoke = FULL_RUN[name], CPU_SMOKE[name]
        shown = [",".join(map(str, v)) if isinstance(v, list) else v for v in (full, smoke)]
        return f"default {shown[0] or 'all'} (cpu: {shown[1]})"

    parser.add_argument("--precisions", type=precision_list, help=default("precisions"))
    parser.add_argument("--batch-sizes", type=batch_size_list, help=default("batch_sizes"))
    parser.add_argument("--seeds", type=seed_list, default=[0], help="e.g. 0,1,2 (default 0)")
    parser.add_argument("--epochs", type=int, help=default("epochs"))
    parser.add_argument("--subset", type=int, help=f"images per split; {default('subset')}")
    parser.add_argument("--model", help=default("model"))
    parser.add_argument(
        "--lr", type=float, default=TrainConfig.lr, help="peak learning rate (vit-s: 0.02)"
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile (in the warm-up)")
    parser.add_argument(
        "--warmup-steps", type=int, help="untimed steps before each engine arm's clock (cpu: 1)"
    )
    parser.add_argument(
        "--profile-steps",
        type=int,
        help="steps of each engine arm's own profile, off the clock after its epochs (device "
        f"busy, tensor-core share); {default('profile_steps')}",
    )
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
    return parser.parse_args()


@dataclass
class Plan:
    """What the parent runs, from the settled options (with_device_defaults)."""

    precisions: list[str]  # the baseline first
    batch_sizes: list[int]
    seeds: list[int]
    subset: int

    @classmethod
    def from_arguments(cls, args: argparse.Namespace) -> Plan:
        """The plan of settled options (with_device_defaults)."""
        return cls(
            precisions=sorted(args.precisions, key=lambda p: p != BASELINE_PRECISION),
            batch_sizes=args.batch_sizes,
            seeds=args.seeds,
            subset=args.subset,
        )


def with_device_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """The parent's options with the device's defaults (CPU_SMOKE or FULL_RUN) where none was
    given: a new namespace, the parsed one left as it was."""
    smoke = args.device == "cpu"
    defaults = CPU_SMOKE if smoke else FULL_RUN
    settled = {name: value for name, value in defaults.items() if getattr(args, name) is None}
    # The smoke test checks the script, not the CPU: an emulated bf16 arm is labelled so.
    settled["allow_emulated"] = args.allow_emulated or smoke
    return argparse.Namespace(**(vars(args) | settled))


@dataclass
class Outcome:
    """Every arm's results by batch size and precision, the bare loops beside them, the
    precisions this device cannot run (and why), and what failed."""

    runs: dict[int, dict[str, list[ArmResults]]]
    bare: dict[int, dict[str, dict[str, Any]]]
    skipped: dict[str, str] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)


def run_engine_arm(args: argparse.Namespace, dataset: Path, tmp: Path, outcome: Outcome,
                   precision: str, batch: int, seed: int) -> None:  # fmt: skip
    """One engine arm and seed: recorded in `outcome` (and --arms), skipped or failed."""
    started = time.perf_counter()
    out = tmp / f"{precision}-b{batch}-s{seed}.json"
    try:
        results = run_arm(args, dataset, precision, batch, seed, out)
    except ArmFailed as error:
        outcome.failed.append(str(error))
        print(f"FAILED: {error}", flush=True)
        return
    if isinstance(results, str):
        outcome.skipped[precision] = results
        print(f"skipped {precision}: {results}", flush=True)
        return
    outcome.runs[batch].setdefault(precision, []).append(results)
    if args.arms:
        with args.arms.open("a") as arms_file:
            arms_file.write(json.dumps(schema.dump(results)) + "\n")
    print(
        f"{precision} batch {batch} seed {seed}: "
        f"{results.timing.throughput_img_s:,.0f} images/s, "
        f"{results.timing.train_time_s:.2f} s training, accuracy "
        f"{results.accuracy:.4f} ({time.perf_counter() - started:.0f} s)",
        flush=True,
    )


def run_all(args: argparse.Namespace, plan: Plan, dataset: Path, tmp: Path) -> Outcome:
    """Seeds outermost, arms interleaved: drift over the run (clocks, heat) hits all arms.
    One bare loop per batch and precision (it has no seed-dependent work), all of a batch
    size's in one process, after its engine arms."""
    outcome = Outcome({b: {} for b in plan.batch_sizes}, {b: {} for b in plan.batch_sizes})
    for seed in plan.seeds:
        for batch in plan.batch_sizes:
            for precision in plan.precisions:
                if precision not in outcome.skipped:
                    run_engine_arm(args, dataset, tmp, outcome, precision, batch, seed)
            ran = [
                p for p in plan.precisions
                if p in outcome.runs[batch] and p not in outcome.bare[batch]
            ]  # fmt: skip
            if args.bare and ran:
                run_bare_arms(args, dataset, ran, batch, seed, tmp, outcome.bare, outcome.failed)
    return outcome


def print_comparisons(outcome: Outcome) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each batch size's arms compared with the baseline, printed: the comparisons and the
    engine / bare ratios, by batch size."""
    comparisons, ratios = {}, {}
    for batch, arms in outcome.runs.items():
        try:
            comparison = compare_arms(arms, baseline=BASELINE_PRECISION)
        except AmpbenchError as error:
            print(f"\nbatch {batch}: no comparison ({error})")
            continue
        comparisons[str(batch)] = schema.dump(comparison)
        print(f"\n===== batch {batch} =====")
        print(render_text(comparison))
        header, rows = tables(comparison)[f"Against {BASELINE_PRECISION}"]
        print()
        print(table(header, rows))
        if outcome.bare[batch]:
            ratios[str(batch)] = engine_over_bare(arms, outcome.bare[batch])
            print()
            print(table(
                ["precision", "engine images/s", "bare images/s", "engine / bare"],
                [[precision, f"{r['engine_img_s']:,.0f}", f"{r['bare_img_s']:,.0f}",
                  round(r["engine_over_bare"], 2)] for precision, r in ratios[str(batch)].items()],
            ))  # fmt: skip
    return comparisons, ratios


def main() -> None:
    args = parse_arguments()
    if args.arm_results is not None:
        sys.exit(train_one_arm(args))
    if args.bare_results is not None:
        sys.exit(bare_loop(args))
    args = with_device_defaults(args)
    plan = Plan.from_arguments(args)
    require_archive(args.data)

    from ampbench.data import SourceOptions, prepare_dataset

    started = time.perf_counter()
    for path in (args.arms, args.bare_arms):
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")
    with tempfile.TemporaryDirectory() as tmp:
        dataset = Path(tmp) / "cifar10"
        prepare_dataset(
            str(args.data), dataset, subset=plan.subset, options=SourceOptions(cache_dir=Path(tmp))
        )
        print(f"prepared {args.data.name} in {time.perf_counter() - started:.1f} s", flush=True)
        outcome = run_all(args, plan, dataset, Path(tmp))
    comparisons, ratios = print_comparisons(outcome)
    total = time.perf_counter() - started
    print(f"\n{args.model}, {args.epochs} epochs, seeds {plan.seeds}, total {total:.0f} s")
    write_json(
        args.json,
        {
            "model": args.model,
            "epochs": args.epochs,
            "subset": plan.subset,
            "seeds": plan.seeds,
            "skipped": outcome.skipped,
            "failed": outcome.failed,
            "total_s": total,
            "comparisons": comparisons,
            "bare": {str(b): loops for b, loops in outcome.bare.items() if loops},
            "engine_over_bare": ratios,
            "profile": str(args.profile) if args.profile else None,
        },
    )
    if outcome.failed:
        sys.exit(f"gpu_benchmark: {len(outcome.failed)} arm(s) failed: {'; '.join(outcome.failed)}")
    if not comparisons:
        sys.exit(f"gpu_benchmark: no batch size had an arm to compare with {BASELINE_PRECISION}")


if __name__ == "__main__":
    main()
