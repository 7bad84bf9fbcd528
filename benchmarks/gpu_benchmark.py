"""Benchmark: the full experiment (CIFAR-10, ResNet-18, 2 epochs) in every precision arm.

Strict fp32, amp (fp16 with GradScaler on CUDA), bf16 and tf32, at batch 128 and 512. Every
arm and seed trains in a process of its own, through the engine's one measurement protocol -
the code the pipeline's train step runs: precision resolved first, an untimed warm-up per arm,
memory read per process. Then each batch size's arms are compared with strict fp32 by the
compare step's own code: the RESULTS block, a table of steady-state speedup, end-to-end time
ratio, memory ratio and accuracy delta with their intervals, and the verdict. All of it is
written as JSON.

It needs this repository and the CIFAR-10 archive; torch, torchvision, numpy, pyarrow, Pillow,
tqdm and scipy (ampbench itself need not be installed; simplejpeg speeds up decoding):

    python benchmarks/gpu_benchmark.py --data cifar10-jpeg.tar.gz --seeds 0,1 --json gpu.json
    python benchmarks/gpu_benchmark.py --device cpu   # smoke test: small-cnn, tiny subset
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
try:
    import ampbench.components
except ImportError:  # a bare checkout: the steps live beside the package, not inside it
    import ampbench

    ampbench.__path__.append(str(REPO))

from common import archive_argument, table, write_json  # noqa: E402

from ampbench import schema  # noqa: E402
from ampbench.components.compare.analysis import compare_arms  # noqa: E402
from ampbench.components.compare.report import render_text, tables  # noqa: E402
from ampbench.components.train.config import TrainConfig  # noqa: E402
from ampbench.errors import AmpbenchError  # noqa: E402
from ampbench.results import ArmResults, read_arm_results  # noqa: E402

CPU_SMOKE = {
    "subset": 256,
    "epochs": 1,
    "precisions": "fp32,bf16",
    "batch_sizes": "64",
    "model": "small-cnn",
}
CANNOT_RUN_HERE = 3  # a child's exit status when the device has no native math for the arm


def train_one_arm(args: argparse.Namespace) -> int:
    """The child: one arm and seed, in this fresh process, results written as JSON."""
    from ampbench.components.train.config import TrainConfig
    from ampbench.components.train.engine import pick_device, train
    from ampbench.components.train.precision import resolve
    from ampbench.results import write_json as write_results

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
    try:
        results, _ = train(config)
    except AmpbenchError as error:
        print(f"{error}", file=sys.stderr)
        return 1
    write_results(args.arm_results, results)
    return 0


def run_arm(args: argparse.Namespace, dataset: Path, precision: str, batch: int, seed: int,
            out: Path) -> ArmResults | str:  # fmt: skip
    """Train one arm and seed in a child process: its results, or why it could not run
    (raises SystemExit if it failed for any other reason)."""
    command = [
        sys.executable, __file__, "--arm-results", str(out), "--dataset", str(dataset),
        "--precision", precision, "--batch-size", str(batch), "--seed", str(seed),
        "--epochs", str(args.epochs), "--model", args.model, "--device", args.device,
        "--lr", str(args.lr),
    ]  # fmt: skip
    command += ["--compile"] if args.compile else []
    command += ["--allow-emulated"] if args.allow_emulated else []
    done = subprocess.run(command, stderr=subprocess.PIPE, text=True)
    if done.returncode == CANNOT_RUN_HERE:
        return done.stderr.strip().splitlines()[-1]
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-5000:])
        raise ArmFailed(f"the {precision} arm (batch {batch}, seed {seed}) failed")
    return read_arm_results(out)


class ArmFailed(Exception):
    """An arm that could run here but did not finish (diverged, crashed)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    archive_argument(parser)
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (smoke)")
    parser.add_argument("--precisions", help="default fp32,amp,bf16,tf32 (cpu: fp32,bf16)")
    parser.add_argument("--batch-sizes", help="default 128,512 (cpu: 64)")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    parser.add_argument("--epochs", type=int, help="default 2 (cpu: 1)")
    parser.add_argument("--subset", type=int, help="images per split; default all (cpu: 256)")
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
    parser.add_argument("--json", type=Path, help="write the comparisons here as JSON")
    parser.add_argument(
        "--arms",
        type=Path,
        help="append each arm's results here as it finishes (JSON lines): kept if the run "
        "is cut short",
    )
    # The child's own arguments (one arm and seed in a fresh process):
    parser.add_argument("--arm-results", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--dataset", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--precision", help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm_results is not None:
        sys.exit(train_one_arm(args))

    smoke = args.device == "cpu"
    args.epochs = args.epochs or (CPU_SMOKE["epochs"] if smoke else 2)
    args.model = args.model or (CPU_SMOKE["model"] if smoke else "resnet18")
    # The smoke test checks the script, not the CPU: an emulated bf16 arm is labelled so.
    args.allow_emulated = args.allow_emulated or smoke
    precisions = args.precisions or (CPU_SMOKE["precisions"] if smoke else "fp32,amp,bf16,tf32")
    precisions = sorted(precisions.split(","), key=lambda p: p != "fp32")  # the baseline first
    sizes = args.batch_sizes or (CPU_SMOKE["batch_sizes"] if smoke else "128,512")
    batch_sizes = [int(b) for b in sizes.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    subset = args.subset if args.subset is not None else (CPU_SMOKE["subset"] if smoke else 0)
    if not args.data.is_file():
        sys.exit(f"gpu_benchmark: {args.data}: no such archive (pass --data)")

    from ampbench.components.prepare import SourceOptions, prepare_dataset

    started = time.perf_counter()
    runs: dict[int, dict[str, list[ArmResults]]] = {b: {} for b in batch_sizes}
    skipped: dict[str, str] = {}
    failed: list[str] = []
    if args.arms:
        args.arms.parent.mkdir(parents=True, exist_ok=True)
        args.arms.write_text("")
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
    comparisons = {}
    for batch, arms in runs.items():
        try:
            comparison = compare_arms(arms, baseline="fp32")
        except AmpbenchError as error:
            print(f"\nbatch {batch}: no comparison ({error})")
            continue
        comparisons[str(batch)] = schema.dump(comparison)
        print(f"\n===== batch {batch} =====")
        print(render_text(comparison))
        header, rows = tables(comparison)["Against fp32"]
        print()
        print(table(header, rows))
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
        },
    )
    if failed:
        sys.exit(f"gpu_benchmark: {len(failed)} arm(s) failed: {'; '.join(failed)}")
    if not comparisons:
        sys.exit("gpu_benchmark: no batch size had an arm to compare with fp32")


if __name__ == "__main__":
    main()
