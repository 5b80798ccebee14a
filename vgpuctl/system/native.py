"""Where the compiled parts of the package live.

``pip install .`` builds them into ``vgpuctl/_native/`` (libvgpu/build.py):

    _native/libvgpu.so                 the hook preloaded into every job
    _native/sim/libcuda.so.1           the simulated GPU's driver API
    _native/sim/libnvidia-ml.so.1      the simulated GPU's NVML
    _native/bin/vgpu-burn              the workload program
    _native/include/vgpu/region.h      the shared region layout
    _native/src/spank_vgpu.c           the SPANK plugin's source, built at a
                                       Slurm site against its spank.h
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from vgpuctl.errors import NativeMissing

NATIVE_DIR = Path(os.environ.get("VGPU_NATIVE_DIR")
                  or Path(__file__).resolve().parent.parent / "_native")


def _need(path: Path) -> Path:
    if not path.exists():
        raise NativeMissing(
            f"{path.name} is missing from {path.parent}: the native parts were not built; "
            f"reinstall from your clone: {sys.prefix}/bin/pip install --force-reinstall "
            "--no-deps ."
        )
    return path


def hook_library() -> Path:
    return _need(NATIVE_DIR / "libvgpu.so")


def sim_libdir() -> Path:
    d = NATIVE_DIR / "sim"
    _need(d / "libcuda.so.1")
    _need(d / "libnvidia-ml.so.1")
    return d


def burn_program() -> Path:
    return _need(NATIVE_DIR / "bin" / "vgpu-burn")


def region_header() -> Path:
    return _need(NATIVE_DIR / "include" / "vgpu" / "region.h")


def spank_source() -> Path:
    return _need(NATIVE_DIR / "src" / "spank_vgpu.c")
