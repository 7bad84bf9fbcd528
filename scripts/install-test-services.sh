#!/usr/bin/env bash
# Install what the tests' real services need: Ceph's radosgw, ceph-mon and ceph-osd (Debian
# and Ubuntu packages; they bring ceph-common with `ceph`, `radosgw-admin` and `monmaptool`),
# and Chromium for the report page's browser test.
# Idempotent. Without root it only says what to install and exits 0: the tests that need the
# services then skip, or fail under CI=true. The MLflow server comes with the Python env.
set -euo pipefail

PACKAGES=(radosgw ceph-mon ceph-osd chromium)
BINARIES=(radosgw ceph-mon ceph-osd radosgw-admin ceph monmaptool chromium)

missing=()
for binary in "${BINARIES[@]}"; do
    command -v "$binary" >/dev/null 2>&1 || missing+=("$binary")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi

if [ "${EUID}" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-test-services: missing ${missing[*]}; the S3 (Ceph RADOS Gateway) and browser tests will" \
        "skip (or fail under CI=true)." >&2
    echo "install-test-services: to run them, install as root:" >&2
    echo "    apt-get install -y --no-install-recommends ${PACKAGES[*]}" >&2
    exit 0
fi

echo "install-test-services: installing ${PACKAGES[*]} (missing: ${missing[*]})" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
for binary in "${BINARIES[@]}"; do
    if ! command -v "$binary" >/dev/null 2>&1; then
        echo "install-test-services: $binary still missing after installing ${PACKAGES[*]}" >&2
        exit 1
    fi
done
