#!/usr/bin/env bash
# The GPU check, one script for a bare GPU machine with no network. It needs torch,
# torchvision, numpy, pyarrow, Pillow, tqdm, scipy and pytest there, installs ampbench itself
# from this checkout (pip install --no-deps --no-build-isolation -e .; where that fails, the
# checkout is put on PYTHONPATH instead), and then:
#   1. runs the tests marked `gpu` (precisions, TF32 really off in fp32, fp16's GradScaler on
#      real data, the memory meter, torch.compile, checkpoint/resume, --device cuda:0);
#   2. runs the full-CIFAR-10 experiment (ResNet-18, 2 epochs) at batch 128 and 512 in fp32,
#      amp (fp16), bf16 and tf32, each arm in a process of its own, and prints the RESULTS
#      block, the table against strict fp32 and the verdict per batch size. One seed by
#      default, to stay within 8 minutes on an H200; --seeds 0,1,2 gives intervals;
#   3. the same for the ViT (vit-s, Linear-heavy: where bf16 and fp8 should gain), batch 512,
#      torch.compile in the warm-up, in fp32, bf16 and fp8 (torchao's tensorwise float8;
#      compute capability 8.9+, else the arm is skipped with its reason).
# Everything lands in OUT: gpu-tests.txt, gpu-benchmark.txt, arms.jsonl (each arm as it
# finishes), gpu.json, and vit-benchmark.txt, vit-arms.jsonl, vit.json. Exit status: non-zero
# if a GPU test failed or a benchmark did, after all have run.
#
#   benchmarks/gpu_check.sh [--data ARCHIVE] [--out DIR] [--seeds 0]
#   benchmarks/gpu_check.sh --cpu-smoke [--data ARCHIVE] [--out DIR]
#
# --cpu-smoke runs the same steps where there is no GPU, small: the gpu tests are collected
# (they would skip), and the benchmarks run their CPU smoke tests (fp8 emulated). `make test` runs it.
set -uo pipefail
cd "$(dirname "$0")/.."

data=${AMPBENCH_CIFAR10_ARCHIVE:-../shared/datasets/cifar10-jpeg.tar.gz}
out=gpu-check
seeds=0
smoke=0
python=${PYTHON:-python3}
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-smoke) smoke=1 ;;
    --data) data=$2; shift ;;
    --out) out=$2; shift ;;
    --seeds) seeds=$2; shift ;;
    -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ ! -f "$data" ]; then
  echo "gpu_check: --data $data: no such file (the CIFAR-10 archive)" >&2
  exit 2
fi
mkdir -p "$out"
export AMPBENCH_CIFAR10_ARCHIVE=$data PYTHONUNBUFFERED=1
started=$SECONDS

if ! "$python" -c "import ampbench.components" 2>/dev/null; then
  if ! "$python" -m pip install --quiet --no-deps --no-build-isolation -e .; then
    # An older setuptools, say: the package's layout as links, on PYTHONPATH.
    shim=$(mktemp -d)
    mkdir "$shim/ampbench"
    ln -s "$PWD"/ampbench/*.py "$shim/ampbench/"
    ln -s "$PWD/components" "$shim/ampbench/components"
    ln -s "$PWD/pipelines" "$shim/ampbench/pipelines"
    export PYTHONPATH="$shim${PYTHONPATH:+:$PYTHONPATH}"
    "$python" -c "import ampbench.components.train.engine" || exit 1
    echo "gpu_check: pip could not install the checkout; using it from PYTHONPATH"
  fi
fi
# A stuck test must not eat the machine's time (pytest-timeout, where installed).
timeout_option=()
"$python" -c "import pytest_timeout" 2>/dev/null && timeout_option=(--timeout=300)

if [ "$smoke" = 1 ]; then
  "$python" -m pytest -m gpu --collect-only -q -p no:cacheprovider tests/test_gpu.py \
    > "$out/gpu-tests.txt"
  tests_rc=$?
  cat "$out/gpu-tests.txt"
  # pytest says "N tests collected" (or "N/M ... (K deselected)"): the gpu tests must be there.
  if ! grep -Eq '^[1-9][0-9]*(/[0-9]+)? tests? collected' "$out/gpu-tests.txt"; then
    echo "gpu_check: no test is marked gpu" >&2
    tests_rc=1
  fi
  "$python" benchmarks/gpu_benchmark.py --device cpu --data "$data" --arms "$out/arms.jsonl" \
    --json "$out/gpu.json" 2>&1 | tee "$out/gpu-benchmark.txt"
  bench_rc=${PIPESTATUS[0]}
  # fp8 runs emulated here (torchao's emulate=True): the script's path, not its speed.
  "$python" benchmarks/gpu_benchmark.py --device cpu --data "$data" --model vit-s --lr 0.02 \
    --precisions fp32,fp8 --subset 32 --batch-sizes 16 --arms "$out/vit-arms.jsonl" \
    --json "$out/vit.json" 2>&1 | tee "$out/vit-benchmark.txt"
  vit_rc=${PIPESTATUS[0]}
else
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  "$python" -m pytest -m gpu -q -p no:cacheprovider "${timeout_option[@]}" tests/test_gpu.py \
    2>&1 | tee "$out/gpu-tests.txt"
  tests_rc=${PIPESTATUS[0]}
  echo "gpu_check: gpu tests done at $((SECONDS - started)) s"
  "$python" benchmarks/gpu_benchmark.py --data "$data" --seeds "$seeds" \
    --arms "$out/arms.jsonl" --json "$out/gpu.json" 2>&1 | tee "$out/gpu-benchmark.txt"
  bench_rc=${PIPESTATUS[0]}
  echo "gpu_check: ResNet-18 benchmark done at $((SECONDS - started)) s"
  "$python" benchmarks/gpu_benchmark.py --data "$data" --seeds "$seeds" --model vit-s --lr 0.02 \
    --compile --precisions fp32,bf16,fp8 --batch-sizes 512 --arms "$out/vit-arms.jsonl" \
    --json "$out/vit.json" 2>&1 | tee "$out/vit-benchmark.txt"
  vit_rc=${PIPESTATUS[0]}
fi
echo "gpu_check: tests exit $tests_rc, benchmark exit $bench_rc, ViT benchmark exit $vit_rc," \
  "$((SECONDS - started)) s in all; outputs in $out/"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ] && [ "$vit_rc" = 0 ]
