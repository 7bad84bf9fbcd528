#!/usr/bin/env bash
# make lint's import contracts (pyproject.toml [tool.importlinter]). import-linter reads a package
# from its folder, and components/ and pipelines/ install into ampbench from the top of the
# repository, so the package is staged in its installed layout first.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STAGE=$ROOT/build/import-layers
rm -rf "$STAGE"
mkdir -p "$STAGE"
cp -r ampbench "$STAGE/ampbench"
cp -r components "$STAGE/ampbench/components"
cp -r pipelines "$STAGE/ampbench/pipelines"
cd "$STAGE"
PYTHONPATH=$STAGE "${BIN:-$ROOT/.venv/bin}/lint-imports" --no-cache "$ROOT/pyproject.toml"
