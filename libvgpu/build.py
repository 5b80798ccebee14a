"""Build every native part of vgpuctl with gcc alone.

No CUDA toolkit, no cmake, no make: the driver and NVML types the code needs
are declared in libvgpu/include. Used by setup.py at install time, and runnable
by hand: ``python libvgpu/build.py OUTDIR``.

Each target lists its sources as globs relative to libvgpu/, so a new source
file joins its target by its name alone.
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

COMMON_CFLAGS = [
    "-std=gnu11", "-O2", "-g", "-fPIC", "-Wall", "-Wextra",
    "-fvisibility=hidden", "-pthread", "-I" + os.path.join(HERE, "include"),
]

# name: (output path relative to OUTDIR, source globs, extra flags, libraries,
#        kind: "shared" or "exe", soname)
TARGETS = {
    "hook": ("libvgpu.so", ["hook/*.c"], [], ["-ldl"], "shared", "libvgpu.so"),
    # -Bsymbolic-functions: the simulator's own calls between its entry points
    # stay inside it, as in the real driver; a preloaded hook sees only the
    # program's calls.
    "sim-cuda": ("sim/libcuda.so.1", ["sim/sim_*.c", "sim/cuda_*.c"], ["-Wl,-Bsymbolic-functions"],
                 ["-ldl", "-lrt"], "shared", "libcuda.so.1"),
    "sim-nvml": ("sim/libnvidia-ml.so.1", ["sim/sim_*.c", "sim/nvml_*.c"],
                 ["-Wl,-Bsymbolic-functions"],
                 ["-ldl", "-lrt"], "shared", "libnvidia-ml.so.1"),
    "vgpu-burn": ("bin/vgpu-burn", ["tools/vgpu_burn*.c"], [], ["-ldl"], "exe", None),
}


def _sources(patterns: list[str]) -> list[str]:
    out: list[str] = []
    for pat in patterns:
        out.extend(sorted(glob.glob(os.path.join(HERE, pat))))
    return out


def build(outdir: str, cc: str | None = None, verbose: bool = False) -> list[str]:
    """Compile every target into outdir; return the paths written."""
    cc = cc or os.environ.get("CC", "gcc")
    extra = shlex.split(os.environ.get("VGPU_CFLAGS", ""))
    written: list[str] = []
    for name, (rel, pats, flags, libs, kind, soname) in TARGETS.items():
        srcs = _sources(pats)
        if not srcs:
            continue
        out = os.path.join(outdir, rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        cmd = [cc, *COMMON_CFLAGS, *flags, *extra]
        if kind == "shared":
            cmd += ["-shared", "-Wl,-soname," + soname, "-Wl,-z,defs"]
        # Write beside the target, then rename: a process that has the old
        # library mapped keeps it intact while the new one replaces it.
        tmp = f"{out}.tmp{os.getpid()}"
        cmd += ["-o", tmp, *srcs, *libs]
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
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python libvgpu/build.py OUTDIR")
    for path in build(sys.argv[1], verbose=True):
        print(path)
