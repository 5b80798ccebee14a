#!/usr/bin/env bash
# Download the wheels a GPU machine without network may lack, for its
# Python (3.12, x86-64 Linux by default), into DIR (default .whl in the
# repository's root, which .gitignore ignores). Run this where PyPI is
# reachable; then carry DIR to the GPU machine, where run_all.sh installs
# them when the module is missing.
#
#   bash bench/gpu/fetch_wheels.sh [DIR]
#
# Environment: WHEEL_PYTHON_VERSION (3.12), WHEEL_PACKAGES ("cffi pycparser":
# vgpuctl reads job regions through cffi, and cffi needs pycparser), PYTHON.
set -eu
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DIR=${1:-$ROOT/.whl}
PYV=${WHEEL_PYTHON_VERSION:-3.12}
PY=${PYTHON:-python3}
mkdir -p "$DIR"
for pkg in ${WHEEL_PACKAGES:-cffi pycparser}; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" \
        --implementation cp --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d "$DIR" "$pkg"
done
ls -l "$DIR"
