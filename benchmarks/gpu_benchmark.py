"""Benchmark: the full experiment (CIFAR-10, ResNet-18, 2 epochs) in every precision arm.

Strict fp32, tf32, fp16 and bf16 at batch 128 and 512; prints training time, images/s, peak
memory, accuracy and the speedup and memory ratio against strict fp32 at the same batch size,
and writes the table as JSON. Goals on an H200 (issue 4): fp16/bf16 2 epochs in <= 3 s of
training time, >= 4x strict fp32, peak memory <= 0.55x fp32.

It needs only this repository and the CIFAR-10 archive (torch, torchvision, numpy, pyarrow,
Pillow and tqdm installed; simplejpeg speeds up decoding if present; ampbench itself need not be):

    python benchmarks/gpu_benchmark.py --data cifar10-jpeg.tar.gz --json gpu.json
    python benchmarks/gpu_benchmark.py --device cpu   # smoke test: tiny subset, fp32 and bf16
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
try:
    import ampbench.components
except ImportError:  # a bare checkout: the steps live beside the package, not inside it
    import ampbench

    ampbench.__path__.append(str(REPO))

from common import archive_argument, table, write_json  # noqa: E402

from ampbench.components.prepare import SourceOptions, prepare_dataset  # noqa: E402
from ampbench.components.train.config import TrainConfig  # noqa: E402
from ampbench.components.train.engine import train  # noqa: E402
from ampbench.errors import AmpbenchError  # noqa: E402

CPU_SMOKE = {"subset": 256, "epochs": 1, "precisions": "fp32,bf16", "batch_sizes": "64"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    archive_argument(parser)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (smoke test)")
    parser.add_argument("--precisions", help="default fp32,tf32,fp16,bf16 (cpu: fp32,bf16)")
    parser.add_argument("--batch-sizes", help="default 128,512 (cpu: 64)")
    parser.add_argument("--epochs", type=int, help="default 2 (cpu: 1)")
    parser.add_argument("--subset", type=int, help="images per split; default all (cpu: 256)")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--compile", action="store_true", help="torch.compile (timed apart)")
    parser.add_argument("--json", type=Path, help="write the table here as JSON")
    args = parser.parse_args()
    smoke = args.device == "cpu"
    precisions = (
        args.precisions or (CPU_SMOKE["precisions"] if smoke else "fp32,tf32,fp16,bf16")
    ).split(",")
    # The baseline first: every other arm's ratios are taken against it.
    precisions.sort(key=lambda precision: precision != "fp32")
    batch_sizes = [
        int(b)
        for b in (args.batch_sizes or (CPU_SMOKE["batch_sizes"] if smoke else "128,512")).split(",")
    ]
    epochs = args.epochs or (CPU_SMOKE["epochs"] if smoke else 2)
    subset = args.subset if args.subset is not None else (CPU_SMOKE["subset"] if smoke else 0)
    if not args.data.is_file():
        sys.exit(f"gpu_benchmark: {args.data}: no such archive (pass --data)")
    started = time.perf_counter()
    rows, records = [], []
    with tempfile.TemporaryDirectory() as tmp:
        dataset = Path(tmp) / "cifar10"
        prepare_dataset(
            str(args.data),
            dataset,
            subset=subset,
            options=SourceOptions(cache_dir=Path(tmp) / "cache"),
        )
        print(f"prepared {args.data.name} in {time.perf_counter() - started:.1f} s", flush=True)
        for batch_size in batch_sizes:
            baseline: dict | None = None
            for precision in precisions:
                config = TrainConfig(
                    dataset_dir=dataset, precision=precision, epochs=epochs, batch_size=batch_size,
                    model=args.model, compile=args.compile, device=args.device,
                )  # fmt: skip
                try:
                    # A short throwaway run of the same arm first: CUDA's lazy kernel loading
                    # and cuDNN's autotuning (per dtype, TF32 setting and shape) would otherwise
                    # land in the measured run's training time, unevenly across the arms.
                    train(replace(config, epochs=1, subset=4 * batch_size))
                    # Only the results: a model kept alive would count in the next arm's memory.
                    results = train(config)[0]
                except AmpbenchError as error:
                    print(f"skipped {precision} at batch {batch_size}: {error}", flush=True)
                    continue
                if precision == "fp32":
                    baseline = results
                speedup = baseline["train_time_s"] / results["train_time_s"] if baseline else None
                memory = (
                    results["peak_memory_mb"] / baseline["peak_memory_mb"] if baseline else None
                )
                record = {
                    "batch_size": batch_size,
                    "precision": precision,
                    "train_time_s": results["train_time_s"],
                    "throughput_img_s": results["throughput_img_s"],
                    "peak_memory_mb": results["peak_memory_mb"],
                    "peak_memory_reserved_mb": results["peak_memory_reserved_mb"],
                    "accuracy": results["accuracy"],
                    "compile_time_s": results["compile_time_s"],
                    "speedup_vs_fp32": speedup,
                    "memory_vs_fp32": memory,
                    "device_name": results["device_name"],
                    "versions": results["versions"],
                }
                records.append(record)
                rows.append(
                    [
                        f"{precision} b{batch_size}",
                        record["train_time_s"],
                        record["throughput_img_s"],
                        record["peak_memory_mb"],
                        f"{record['accuracy']:.4f}",
                        "-" if speedup is None else f"{speedup:.2f}x",
                        "-" if memory is None else f"{memory:.2f}",
                    ]
                )
                print(
                    f"{precision} batch {batch_size}: {record['train_time_s']:.2f} s, "
                    f"accuracy {record['accuracy']:.4f}",
                    flush=True,
                )
    device_name = records[0]["device_name"] if records else args.device
    total = time.perf_counter() - started
    print(f"\n{args.model}, {epochs} epochs, {device_name}, total {total:.0f} s")
    print(
        table(["arm", "train s", "images/s", "peak MB", "accuracy", "speedup", "mem ratio"], rows)
    )
    write_json(
        args.json, {"device": device_name, "epochs": epochs, "subset": subset, "runs": records}
    )


if __name__ == "__main__":
    main()
