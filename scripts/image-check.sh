#!/usr/bin/env bash
# `make image-check`: build docker/Dockerfile for real without a Docker daemon, then run the
# pipeline's three steps inside the built image as a pod would start them: uid 10001, a
# read-only root filesystem, a writable /tmp (the emptyDir a pod mounts there).
#
# Buildah builds it (chroot isolation: no daemon, no cgroups). The pytorch/pytorch base cannot
# be pulled here, so a stand-in is made under the same name (PYTORCH_IMAGE is a build
# argument) from Debian's packages:
# - Debian bookworm (debootstrap, minbase);
# - Debian's Python 3.11 in a venv at /opt/conda, where the official image keeps its Python;
# - the torch and torchvision wheels that pip installs on this machine, with their CUDA
#   libraries.
# What it differs in from pytorch/pytorch:<v>-cuda<c>-cudnn<d>-runtime: Debian, not Ubuntu; a
# venv, not conda; Python 3.11, not the image's own; torch's CUDA from the nvidia-* wheels,
# not the image's system CUDA and cuDNN; this machine's CA bundle (its proxy's CA), with
# PIP_CERT pointing at it. No GPU here, so the steps run on the CPU.
#
#   scripts/image-check.sh [--data CIFAR_ARCHIVE]    (needs root: chroot, mounts)
# Work and cache in $IMAGE_CHECK_DIR (default /var/tmp/ampbench-image-check); the stand-in base
# is kept in buildah's store and reused.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
data=$("$python" benchmarks/common.py)  # $AMPBENCH_CIFAR10_ARCHIVE, or beside the checkout
[ "${1:-}" = --data ] && data=$2
work=${IMAGE_CHECK_DIR:-/var/tmp/ampbench-image-check}
torch_version=2.14.1
torchvision_version=0.29.1
base=localhost/pytorch/pytorch
base_tag=$torch_version-cuda12.6-cudnn9-runtime
image=localhost/ampbench:image-check

for tool in buildah debootstrap unshare chroot; do
  command -v "$tool" >/dev/null \
    || { echo "image-check: needs $tool (apt-get install buildah debootstrap)" >&2; exit 2; }
done
[ -f "$data" ] || { echo "image-check: --data $data: no such file (the CIFAR-10 archive)" >&2; exit 2; }
data=$(realpath "$data")
step() { echo "== image-check: $* (at $SECONDS s)"; }
mkdir -p "$work"

if ! buildah inspect --type image "$base:$base_tag" >/dev/null 2>&1; then
  rootfs=$work/rootfs
  step "stand-in base: debootstrap bookworm"
  rm -rf "$rootfs"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$rootfs" http://deb.debian.org/debian > "$work/debootstrap.log"
  step "stand-in base: torch $torch_version and torchvision $torchvision_version"
  # Downloaded here, where pip finds them on this machine's disk; installed in the chroot.
  "$python" -m pip download --quiet --dest "$work/wheels" \
    "torch==$torch_version" "torchvision==$torchvision_version"
  chroot "$rootfs" python3 -m venv /opt/conda
  mkdir -p "$rootfs/tmp/wheels"
  cp "$work"/wheels/*.whl "$rootfs/tmp/wheels/"
  chroot "$rootfs" /opt/conda/bin/python -m pip install --quiet --no-index --no-cache-dir \
    --find-links /tmp/wheels "torch==$torch_version" "torchvision==$torchvision_version"
  rm -rf "$rootfs/tmp/wheels" "$rootfs"/var/cache/apt/archives/*.deb
  container=$(buildah from scratch)
  mountpoint=$(buildah mount "$container")
  cp -a "$rootfs/." "$mountpoint/"
  # This machine reaches PyPI through a proxy whose CA only its own bundle holds: the build's
  # pip must trust it too.
  cp /etc/ssl/certs/ca-certificates.crt "$mountpoint/etc/ssl/certs/ca-certificates.crt"
  buildah umount "$container" >/dev/null
  buildah config --env PATH=/opt/conda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env PIP_CERT=/etc/ssl/certs/ca-certificates.crt --workingdir /workspace "$container"
  buildah commit --quiet "$container" "$base:$base_tag" >/dev/null
  buildah rm "$container" >/dev/null
  rm -rf "$rootfs"
fi
step "stand-in base: $(buildah images --format '{{.Size}}' "$base:$base_tag")"

step "docker/Dockerfile on the stand-in base"
buildah bud --isolation chroot --quiet -f docker/Dockerfile \
  --build-arg PYTORCH_IMAGE=$base -t "$image" . > "$work/build.log" 2>&1 \
  || { tail -40 "$work/build.log" >&2; echo "image-check: the build failed" >&2; exit 1; }
step "built $image: $(buildah images --format '{{.Size}}' "$image")"

# The steps' command lines as the KFP launcher runs them (the compiled executors, an executor
# input each): written here, run in the image.
steps=$work/steps
rm -rf "$steps"
"$python" scripts/kfp_step_commands.py "$image" /tmp/data/cifar10.tar.gz "$steps"

container=$(buildah from "$image")
trap 'buildah umount "$container" >/dev/null 2>&1; buildah rm "$container" >/dev/null 2>&1' EXIT
root=$(buildah mount "$container")
user=$(buildah inspect --type image --format '{{.OCIv1.Config.User}}' "$image")
mapfile -t env < <(buildah inspect --type image --format '{{range .OCIv1.Config.Env}}{{println .}}{{end}}' "$image")
workdir=$(buildah inspect --type image --format '{{.OCIv1.Config.WorkingDir}}' "$image")
step "the three steps as user $user, root filesystem read-only; $workdir and /minio writable"
# A private mount namespace: the image's root bound read-only onto itself; tmpfs where a pod
# mounts emptyDirs (/tmp, and /minio, where the executor keeps minio:// artifacts); /proc and
# /dev; the archive read-only. Then each step chrooted into it as the image's user, with the
# image's environment only.
# shellcheck disable=SC2016 # expanded by the inner shell
unshare --mount --propagation private bash -euo pipefail -c '
  root=$1 user=$2 data=$3 steps=$4; shift 4
  mount --bind "$root" "$root" && mount -o remount,bind,ro "$root"
  for writable in tmp minio; do
    mount -t tmpfs -o size=4g,mode=1777 tmpfs "$root/$writable"
  done
  mount -t proc proc "$root/proc"
  mount --rbind /dev "$root/dev"
  mkdir "$root/tmp/data" && touch "$root/tmp/data/cifar10.tar.gz"
  mount --bind -o ro "$data" "$root/tmp/data/cifar10.tar.gz"
  in_image() { chroot --userspec="$user" "$root" env -i "$@"; }
  if in_image "$@" sh -c "touch /probe" 2>/dev/null; then
    echo "image-check: the root filesystem is writable" >&2; exit 1
  fi
  echo "-- uid in the image: $(in_image "$@" id -u); root filesystem read-only: yes"
  for file in "$steps"/*.argv; do
    mapfile -d "" -t argv < "$file"
    name=$(basename "$file" .argv)
    echo "-- ${name#*-}: ${argv[*]:0:2} ... --function_to_execute ${argv[-1]}"
    started=$SECONDS
    in_image "$@" "${argv[@]}" > "$steps/$name.log" 2>&1 \
      || { tail -30 "$steps/$name.log" >&2; echo "image-check: step $name failed" >&2; exit 1; }
    echo "   done in $((SECONDS - started)) s"
  done
  echo "-- outputs, as the launcher would upload them:"
  (cd "$root/minio/mlpipeline/v2/artifacts/image-check" && find . -maxdepth 2 | sort | sed "s/^/   /")
  in_image "$@" python -c "import json; c = json.load(open(\"/minio/mlpipeline/v2/artifacts/image-check/compare/comparison\")); print(\"   verdict:\", c[\"verdict\"])"
' image-check "$root" "$user" "$data" "$steps" "${env[@]}"
step "passed"
