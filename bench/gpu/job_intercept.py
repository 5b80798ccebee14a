"""Job program: does the hook see the CUDA runtime's own path?

    python3 job_intercept.py [--mib 256]

PyTorch allocates through the CUDA runtime (cudaMalloc), and the runtime
reaches the driver by dlopen("libcuda.so.1") + cuGetProcAddress, never by
linking to it. This program allocates `--mib` MiB and runs a kernel, then
reads its OWN process slot in the job's region (VGPU_REGION, set by
`vgpuctl run`) while it is alive: the hook's counters get_proc_calls
(lookups it answered), allocs (allocating calls it accounted), launches and
used bytes. Prints one JSON line, with the CUDA libraries mapped in the
process (/proc/self/maps).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import job_util

MiB = 1 << 20


def mapped_libraries() -> list[str]:
    libs = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6:
            name = os.path.basename(parts[5])
            if any(k in name for k in ("libcuda", "libcudart", "libvgpu", "libnvidia-ml")):
                libs.add(parts[5])
    return sorted(libs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256)
    args = ap.parse_args()
    region = os.environ.get("VGPU_REGION")
    if not region:
        job_util.fail("VGPU_REGION is not set: run me under `vgpuctl run`")
    torch = job_util.torch_cuda()
    x = torch.empty(args.mib * MiB, dtype=torch.uint8, device="cuda")
    y = torch.ones(1 << 20, device="cuda") * 2
    torch.cuda.synchronize()
    total = float(y.sum().item())

    # the harness put this tree on PYTHONPATH; vgpuctl's reader of the region
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from vgpuctl.system.region import Region

    usage = Region.open(region).read_usage()
    me = [p for p in usage.procs if p.pid == os.getpid()]
    if not me:
        job_util.fail("no process slot of mine in the job's region",
                      region=region, pids=[p.pid for p in usage.procs])
    s = me[0]
    job_util.emit({
        "torch": torch.__version__, "region": region, "allocated": x.numel(),
        "kernel_result_ok": total == 2.0 * (1 << 20),
        "get_proc_calls": s.get_proc_calls, "allocs": s.allocs,
        "launches": s.launches[0] if s.launches else None,
        "used": s.used[0] if s.used else None,
        "ctx_bytes": s.ctx_bytes[0] if s.ctx_bytes else None,
        "job_used": usage.devices[0].used if usage.devices else None,
        "libraries": mapped_libraries(),
    })


if __name__ == "__main__":
    main()
