"""Build every native part of vgpuctl with gcc alone.

No CUDA toolkit, no cmake, no make: the driver and NVML types the code needs
are declared in libvgpu/include. Used by setup.py at install time, and runnable
by hand: ``python libvgpu/build.py OUTDIR [TARGET...]`` (all targets when none
is named; VGPU_CFLAGS adds compile flags, e.g. ``VGPU_CFLAGS=-O0``).

Each target lists its sources as globs relative to libvgpu/, so a new source
file joins its target by its name alone. libvgpu/common/ is compiled into
every target (the one size parser, for instance).
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import subprocess
import sys
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))

COMMON_CFLAGS = [
    "-std=gnu11", "-O2", "-g", "-fPIC", "-Wall", "-Wextra",
    "-fvisibility=hidden", "-pthread", "-I" + os.path.join(HERE, "include"),
]


class Target(NamedTuple):
    out: str                # path relative to OUTDIR
    sources: list[str]      # globs relative to libvgpu/
    cflags: list[str]       # compile flags beyond COMMON_CFLAGS
    ldflags: list[str]      # link flags (before the sources)
    libs: list[str]         # libraries (after the sources)
    kind: str               # "shared" or "exe"
    soname: str | None


# The simulator's files include their own directory's headers by name and the
# common layer's as "common/sim.h": cuda/ and nvml/ build on common/, never on
# each other (tests/sim/test_native_layout.py checks it with compile_flags).
SIM_CFLAGS = ["-I" + os.path.join(HERE, "sim")]
# -Bsymbolic-functions: the simulator's own calls between its entry points
# stay inside it, as in the real driver; a preloaded hook sees only the
# program's calls.
SIM_LDFLAGS = ["-Wl,-Bsymbolic-functions"]

TARGETS = {
    # hook/*.S: the dlsym entry, one source for x86_64 and aarch64.
    "hook": Target("libvgpu.so", ["hook/*.c", "hook/*.S", "common/*.c"], [], [], ["-ldl"],
                   "shared", "libvgpu.so"),
    "sim-cuda": Target("sim/libcuda.so.1", ["sim/common/*.c", "sim/cuda/*.c", "common/*.c"],
                       SIM_CFLAGS, SIM_LDFLAGS, ["-ldl", "-lrt"], "shared", "libcuda.so.1"),
    "sim-nvml": Target("sim/libnvidia-ml.so.1", ["sim/common/*.c", "sim/nvml/*.c", "common/*.c"],
                       SIM_CFLAGS, SIM_LDFLAGS, ["-ldl", "-lrt"], "shared", "libnvidia-ml.so.1"),
    "vgpu-burn": Target("bin/vgpu-burn", ["tools/vgpu_burn*.c", "common/*.c"], [], [],
                        ["-ldl", "-lm"],
                        "exe", None),
}


def sources(name: str) -> list[str]:
    """The source files of a target, in build order."""
    out: list[str] = []
    for pat in TARGETS[name].sources:
        out.extend(sorted(glob.glob(os.path.join(HERE, pat))))
    return out


def compile_flags(name: str) -> list[str]:
    """What every source file of a target is compiled with (no link flags)."""
    return [*COMMON_CFLAGS, *TARGETS[name].cflags,
            *shlex.split(os.environ.get("VGPU_CFLAGS", ""))]


def build(outdir: str, cc: str | None = None, verbose: bool = False,
          targets: list[str] | None = None) -> list[str]:
    """Compile the targets (default: all) into outdir; return the paths written."""
    cc = cc or os.environ.get("CC", "gcc")
    unknown = set(targets or ()) - set(TARGETS)
    if unknown:
        raise ValueError(f"no such target: {', '.join(sorted(unknown))} "
                         f"(targets: {', '.join(TARGETS)})")
    written: list[str] = []
    for name, target in TARGETS.items():
        if targets and name not in targets:
            continue
        srcs = sources(name)
        if not srcs:
            continue
        out = os.path.join(outdir, target.out)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        cmd = [cc, *compile_flags(name), *target.ldflags]
        if target.kind == "shared":
            cmd += ["-shared", "-Wl,-soname," + str(target.soname), "-Wl,-z,defs"]
        # Write beside the target, then rename: a process that has the old
        # library mapped keeps it intact while the new one replaces it.
        tmp = f"{out}.tmp{os.getpid()}"
        cmd += ["-o", tmp, *srcs, *target.libs]
        if verbose:
            print(" ".join(shlex.quote(c) for c in cmd), file=sys.stderr)
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise RuntimeError(f"building {name} failed:\n{res.stderr}")
        os.replace(tmp, out)
        if res.stderr.strip():
            # Warnings are errors in spirit: show them.
            print(res.stderr, file=sys.stderr)
        written.append(out)
    # The region layout travels with the package: vgpuctl.region parses it.
    hdr_dir = os.path.join(outdir, "include", "vgpu")
    os.makedirs(hdr_dir, exist_ok=True)
    hdr = os.path.join(hdr_dir, "region.h")
    shutil.copyfile(os.path.join(HERE, "include", "vgpu", "region.h"), hdr)
    written.append(hdr)
    # So does the SPANK plugin's source: a site builds it against its own
    # Slurm's spank.h (`vgpuctl slurm build-spank`).
    src_dir = os.path.join(outdir, "src")
    os.makedirs(src_dir, exist_ok=True)
    spank = os.path.join(src_dir, "spank_vgpu.c")
    shutil.copyfile(os.path.join(HERE, "slurm", "spank_vgpu.c"), spank)
    written.append(spank)
    return written


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python libvgpu/build.py OUTDIR [TARGET...]  "
                 f"(targets: {', '.join(TARGETS)})")
    try:
        paths = build(sys.argv[1], verbose=True, targets=sys.argv[2:])
    except ValueError as e:
        sys.exit(str(e))
    for path in paths:
        print(path)
