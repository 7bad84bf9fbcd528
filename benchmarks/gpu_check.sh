#!/usr/bin/env bash
# The GPU check, one command for a bare GPU machine with no network. Prepare the bundle where
# PyPI is reachable (`make gpu-bundle`: ampbench's wheel and every wheel it needs beyond the
# machine's torch, torchvision and scientific stack), carry it there with the checkout and the
# CIFAR-10 archive, and run
#
#   benchmarks/gpu_check.sh --bundle dist/gpu-bundle [--data ARCHIVE] [--out DIR] [--seeds 0]
#
# It installs the bundle into a fresh folder (pip --no-index --no-deps --target; nothing is
# installed into the machine's Python), and runs everything from a copy of tests/ and
# benchmarks/ with PYTHONSAFEPATH=1, so that the checkout's own ampbench/ (which lacks the
# steps) never shadows the installed package. Without --bundle, the ampbench that $PYTHON
# (default python3) already has is checked. Stages, each under its own time limit, each
# output in OUT (default gpu-check/) as STAGE.txt:
#   install     the bundle, and where ampbench is imported from
#   gpu-tests   the tests marked `gpu` (precisions, TF32 really off in fp32, fp16's GradScaler
#               on real data, the memory meter, torch.compile, checkpoint/resume, cuda:0)
#   resnet      full CIFAR-10, ResNet-18, 2 epochs, batch 128 and 512, fp32, amp (fp16), bf16
#               and tf32, each arm in a process of its own, with a bare-loop arm per precision
#               (engine / bare); arms.jsonl, bare.jsonl, gpu.json (the smoke: profiles/ too)
#   vit         vit-s, batch 512, torch.compile, fp32, bf16 and fp8 (compute capability 8.9+,
#               else skipped with its reason); vit-arms.jsonl, vit.json
#   compile-cache  small-cnn bf16 compiled by one process, fetched by the next from the
#               shared compile cache (compile_cache.py; on a GPU only); compile-cache.json
#   pipeline    one short `ampbench run` of the whole pipeline (KFP local runner, MLflow in a
#               sqlite file): 2,048 images, 1 epoch; its outputs in pipeline/
# A failing stage does not stop the others; the exit status is non-zero if any failed. Each
# stage's time is printed, and the total against the 8 minutes it is meant to take on an H200.
# Where CUDA is not visible it stops at once (the gpu tests would all skip).
#
#   benchmarks/gpu_check.sh --cpu-smoke [--bundle DIR] [--data ARCHIVE] [--out DIR]
#
# --cpu-smoke runs the same stages where there is no GPU, small: the gpu tests are collected
# (they would skip), the benchmarks run their CPU smoke tests (fp8 emulated), and the pipeline
# trains small-cnn on 64 images. `make test` runs it with a bundle built for its Python.
set -uo pipefail
checkout=$(cd "$(dirname "$0")/.." && pwd)

python=${PYTHON:-python3}
data=$("$python" "$checkout/benchmarks/common.py")  # $AMPBENCH_CIFAR10_ARCHIVE, or beside the checkout
out=gpu-check
seeds=0
smoke=0
bundle=
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-smoke) smoke=1 ;;
    --bundle) bundle=${2-}; shift ;;
    --data) data=${2-}; shift ;;
    --out) out=${2-}; shift ;;
    --seeds) seeds=${2-}; shift ;;
    -h|--help) sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ ! -f "$data" ]; then
  echo "gpu_check: --data $data: no such file (the CIFAR-10 archive)" >&2
  exit 2
fi
if [ -n "$bundle" ] && ! grep -qs '"complete": true' "$bundle/bundle.json"; then
  echo "gpu_check: --bundle $bundle: not a complete bundle (no bundle.json; make gpu-bundle)" >&2
  exit 2
fi
if ! mkdir -p "$out"; then
  echo "gpu_check: --out $out: cannot be created" >&2
  exit 2
fi
data=$(realpath "$data")
out=$(realpath "$out")
[ -n "$bundle" ] && bundle=$(realpath "$bundle")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# What runs sees no ampbench/ folder: a copy of the tests and benchmarks only, and no script's
# or current directory put first on sys.path (PYTHONSAFEPATH, Python 3.11+).
mkdir "$work/checkout"
cp -r "$checkout/tests" "$checkout/benchmarks" "$checkout/pyproject.toml" "$work/checkout/"
cd "$work/checkout" || exit 1
export PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1 AMPBENCH_CIFAR10_ARCHIVE=$data
export XDG_CACHE_HOME=$work/cache MLFLOW_TRACKING_URI=sqlite:///$out/pipeline/mlflow.db
mkdir -p "$out/pipeline"

started=$SECONDS
failed=()
summary=()
# stage NAME LIMIT_S COMMAND...: run it under `timeout` (the whole process group: an arm's
# child too), its output on the terminal and in OUT/NAME.txt.
stage() {
  local name=$1 limit=$2 begun=$SECONDS rc
  shift 2
  echo "gpu_check: stage $name (limit $limit s)"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$name.txt"
  rc=${PIPESTATUS[0]}
  local line="$name: $((SECONDS - begun)) s"
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    line+=", FAILED (timed out after $limit s)"
  elif [ "$rc" != 0 ]; then
    line+=", FAILED (exit $rc)"
  fi
  [ "$rc" = 0 ] || failed+=("$name")
  summary+=("$line")
  echo "gpu_check: $line"
  return "$rc"
}

if [ -n "$bundle" ]; then
  export PYTHONPATH=$work/site${PYTHONPATH:+:$PYTHONPATH} PATH=$work/site/bin:$PATH
  if stage install 120 "$python" -m pip install --quiet --disable-pip-version-check --no-index \
    --no-deps --target "$work/site" "$bundle"/*.whl; then
    wheels=("$bundle"/*.whl)
    echo "${#wheels[@]} wheels, $(du -sh "$bundle" | cut -f1), installed into $work/site" \
      | tee -a "$out/install.txt"
  fi
fi
# Which ampbench runs: the bundle's (a path under $work/site), or the one $PYTHON has.
where=$("$python" -c "import ampbench.components, ampbench; print(ampbench.__file__)" 2>&1)
if [ $? != 0 ] || { [ -n "$bundle" ] && [[ $where != "$work/site/"* ]]; }; then
  echo "gpu_check: ampbench cannot be imported from ${bundle:-$python}: ${where##*$'\n'}" >&2
  exit 1
fi
echo "ampbench imported from $where" | tee -a "$out/install.txt"
if [ "$smoke" = 0 ] && ! "$python" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
  echo "gpu_check: CUDA is not visible to torch here (run where a GPU is, or pass --cpu-smoke)" >&2
  exit 1
fi

bench=(benchmarks/gpu_benchmark.py --data "$data")
if [ "$smoke" = 1 ]; then
  # pytest says "N tests collected" (or "N/M ... (K deselected)"): the gpu tests must be there.
  stage gpu-tests 120 bash -c '"$0" -m pytest -m gpu --collect-only -q -p no:cacheprovider \
    tests/test_gpu.py | tee /dev/stderr | grep -Eq "^[1-9][0-9]*(/[0-9]+)? tests? collected"' \
    "$python"
  stage resnet 300 "$python" "${bench[@]}" --device cpu --arms "$out/arms.jsonl" \
    --bare-arms "$out/bare.jsonl" --json "$out/gpu.json" --profile "$out/profiles"
  # fp8 runs emulated here (torchao's emulate=True): the script's path, not its speed.
  stage vit 300 "$python" "${bench[@]}" --device cpu --model vit-s --lr 0.02 --no-bare \
    --precisions fp32,fp8 --subset 16 --batch-sizes 8 --arms "$out/vit-arms.jsonl" \
    --json "$out/vit.json"
  pipeline=(--subset 64 --batch-size 16 --model small-cnn --allow-emulated --profile-steps 2)
else
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  timeout_option=()  # a stuck test must not eat the machine's time (pytest-timeout)
  "$python" -c "import pytest_timeout" 2>/dev/null && timeout_option=(--timeout=120)
  stage gpu-tests 180 "$python" -m pytest -m gpu -q -rA -p no:cacheprovider \
    "${timeout_option[@]}" tests/test_gpu.py
  stage resnet 330 "$python" "${bench[@]}" --seeds "$seeds" --arms "$out/arms.jsonl" \
    --bare-arms "$out/bare.jsonl" --json "$out/gpu.json"
  stage vit 180 "$python" "${bench[@]}" --seeds "$seeds" --model vit-s --lr 0.02 --compile \
    --no-bare --precisions fp32,bf16,fp8 --batch-sizes 512 --arms "$out/vit-arms.jsonl" \
    --json "$out/vit.json"
  # A step compiled, then fetched by a second process from the shared compile cache (small:
  # the whole check must stay within its 8 minutes).
  stage compile-cache 90 "$python" benchmarks/compile_cache.py --data "$data" \
    --model small-cnn --batch-size 128 --precision bf16 --repeats 1 \
    --json "$out/compile-cache.json"
  pipeline=(--subset 2048)
fi
stage pipeline 150 ampbench run --data "$data" --epochs 1 "${pipeline[@]}" \
  --output-dir "$out/pipeline/run"

total=$((SECONDS - started))
{
  printf 'gpu_check: %s\n' "${summary[@]}"
  echo "gpu_check: $total s in all$([ "$smoke" = 0 ] && [ "$total" -gt 480 ] && echo ", over the 8 minutes it should take on an H200"); outputs in $out/"
  if [ ${#failed[@]} -gt 0 ]; then
    echo "gpu_check: FAILED: ${failed[*]}"
  else
    echo "gpu_check: every stage passed"
  fi
} | tee "$out/summary.txt"
[ ${#failed[@]} = 0 ]
