#!/usr/bin/env bash
# `make mutation`: mutmut over the modules whose mistakes would change a user's answer, against
# the fast tests that cover them. mutmut names a mutant by its file's path, so the sources are
# staged in their installed layout (components/ as ampbench/components) under build/mutation.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN=${BIN:-$ROOT/.venv/bin}
STAGE=${STAGE:-$ROOT/build/mutation}
# MODULES and TESTS narrow a run, e.g. MODULES=ampbench/results.py TESTS=tests/test_results.py
read -r -a MODULES <<<"${MODULES:-ampbench/compare/analysis.py ampbench/compare/summary.py \
ampbench/compare/wording.py ampbench/compare/published.py ampbench/compare/stats.py \
ampbench/train/precision.py ampbench/results.py ampbench/comparison.py ampbench/old_results.py \
ampbench/data/dataset.py}"
read -r -a TESTS <<<"${TESTS:-tests/test_compare.py tests/test_compare_files.py tests/test_compare_matrix.py \
tests/test_wording.py tests/test_prepare.py tests/test_precision.py tests/test_results.py}"

rm -rf "$STAGE"
mkdir -p "$STAGE"
cp -r ampbench "$STAGE/ampbench"
cp -r components "$STAGE/ampbench/components"
cp -r pipelines "$STAGE/ampbench/pipelines"
cp -r tests "$STAGE/tests"
find "$STAGE" -name __pycache__ -prune -exec rm -rf {} +
# mutmut reads setup.cfg's [mutmut] section; pyproject.toml's pytest settings come along too.
cp pyproject.toml "$STAGE/"
{
    echo "[mutmut]"
    echo "source_paths=ampbench/"
    # Workers fork from a server that has run no torch op: a fork of a process whose thread
    # pools are up deadlocks in the first op.
    echo "process_isolation=forkserver"
    echo "only_mutate="
    printf '    %s\n' "${MODULES[@]}"
    echo "pytest_add_cli_args_test_selection="
    printf '    %s\n' "${TESTS[@]}"
    # The real CIFAR-10 archive's test takes 15 s, more than the rest of test_prepare.py;
    # what it checks of dataset.py (a stratified, seeded subset) is checked on small data too.
    echo "pytest_add_cli_args="
    printf '    %s\n' -p no:xdist -p no:cacheprovider -p mutation_order \
        --deselect=tests/test_prepare.py::test_cifar10_archive_subset_is_stratified_and_seeded
} >"$STAGE/setup.cfg"

cd "$STAGE"
start=$SECONDS
PYTHONPATH="$ROOT/scripts${PYTHONPATH:+:$PYTHONPATH}" "$BIN/mutmut" run --max-children "${JOBS:-2}" >mutmut-run.log 2>&1 || {
    tail -40 mutmut-run.log
    exit 1
}
"$BIN/mutmut" results --all true >mutmut-results.txt
"$BIN/python" "$ROOT/scripts/mutation_score.py" mutmut-results.txt "${MODULES[@]}"
echo "mutation testing took $((SECONDS - start)) s; survivors: $STAGE/mutmut-results.txt" \
    "(mutmut show NAME there shows one)"
