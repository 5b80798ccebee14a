"""Job program: keep the GPU busy a known fraction of the time.

    python3 job_duty.py --duty PCT [--cycle-ms 50] [--kernel-ms 5] [--blocks 0]
                        [--seconds 10] [--alloc-mib 0] [--barrier DIR --name N]

Driver API through NVIDIA's cuda-bindings (no toolkit, no torch). Every
cycle of --cycle-ms, it launches spin kernels adding up to PCT % of the
cycle back to back on one stream, waits for them (an event), then sleeps on
the host until the cycle ends; at 100 % it never sleeps. The kernel is the
PTX vgpu-burn embeds: it spins on %globaltimer for its u64 argument in
nanoseconds, so a real driver runs it for that long (JIT from PTX, no
toolkit), and the simulated GPU runs any `vgpu_spin*` kernel for that long.
--blocks 0 (the default) launches one block per SM, so the whole GPU is
busy while a kernel runs; --blocks 1 is vgpu-burn's single block.

--alloc-mib allocates that much device memory first: a harness that cannot
match NVML's pids with its own (another pid namespace) tells the jobs apart
by their memory.

Prints one JSON line: the settings, `cycles`, `busy_s` (the bursts' lengths
timed by events), `seconds` (the go to the end of the last cycle, its idle part
counted whole), `busy_pct`
(= busy_s / seconds), `first_launch` and `last_end` (host time.time()), and
`bursts`, one [host start, host end, event ms] per cycle.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import time
from typing import Any

import job_util


def burst_kernels(busy_ns: int, kernel_ns: int) -> list[int]:
    """The kernel lengths (ns) of one burst: whole kernels, then the rest."""
    n, rest = divmod(busy_ns, kernel_ns)
    return [kernel_ns] * n + ([rest] if rest >= 1000 else [])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duty", type=float, required=True, help="percent of each cycle busy")
    ap.add_argument("--cycle-ms", type=float, default=50.0)
    ap.add_argument("--kernel-ms", type=float, default=5.0, help="length of one spin kernel")
    ap.add_argument("--blocks", type=int, default=0, help="blocks per kernel; 0: one per SM")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long to run after the go")
    ap.add_argument("--alloc-mib", type=int, default=0)
    ap.add_argument("--device", type=int, default=0)
    job_util.add_barrier_args(ap)
    args = ap.parse_args()
    if not 0 < args.duty <= 100:
        job_util.fail("--duty must be in (0, 100]", 2)
    if args.cycle_ms <= 0 or args.kernel_ms <= 0:
        job_util.fail("--cycle-ms and --kernel-ms must be positive", 2)
    cu = job_util.cuda_driver()

    def ck(res: Any, what: str) -> Any:
        res = res if isinstance(res, tuple) else (res,)
        if int(res[0]) != 0:
            job_util.fail(f"{what}: {getattr(res[0], 'name', res[0])}", 1)
        return res[1] if len(res) == 2 else res[1:]

    ck(cu.cuInit(0), "cuInit")
    dev = ck(cu.cuDeviceGet(args.device), "cuDeviceGet")
    ctx = ck(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    sms = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    blocks = args.blocks or ck(cu.cuDeviceGetAttribute(sms, dev), "cuDeviceGetAttribute")
    if args.alloc_mib:
        ck(cu.cuMemAlloc(args.alloc_mib << 20), "cuMemAlloc")
    mod = ck(cu.cuModuleLoadData(job_util.SPIN_PTX + b"\0"), "cuModuleLoadData")
    fn = ck(cu.cuModuleGetFunction(mod, b"vgpu_spin"), "cuModuleGetFunction")
    stream = ck(cu.cuStreamCreate(0), "cuStreamCreate")
    # Below 100 % one burst is in flight at a time; at 100 % two, so the
    # GPU never waits for the host between bursts.
    depth = 2 if args.duty >= 100 else 1
    events = [(ck(cu.cuEventCreate(0), "cuEventCreate"), ck(cu.cuEventCreate(0), "cuEventCreate"))
              for _ in range(depth)]

    def launch(ns: int) -> None:
        ck(cu.cuLaunchKernel(fn, blocks, 1, 1, 1, 1, 1, 0, stream,
                             ((ns,), (ctypes.c_uint64,)), 0), "cuLaunchKernel")

    cycle_s = args.cycle_ms / 1000
    kernels = burst_kernels(round(args.duty / 100 * args.cycle_ms * 1e6),
                            round(args.kernel_ms * 1e6))
    go = job_util.wait_barrier(args)
    stop_at = go + args.seconds
    bursts: list[list[float]] = []
    pending: collections.deque[tuple[float, Any, Any]] = collections.deque()
    busy_ms = 0.0

    def wait_oldest() -> float:
        """Wait for the oldest burst in flight; record it; the time now."""
        nonlocal busy_ms
        t0, start, end = pending.popleft()
        ck(cu.cuEventSynchronize(end), "cuEventSynchronize")
        ms = float(ck(cu.cuEventElapsedTime(start, end), "cuEventElapsedTime"))
        now = time.time()
        bursts.append([round(t0, 6), round(now, 6), round(ms, 3)])
        busy_ms += ms
        return now

    due = go
    now = go
    n = 0
    while now < stop_at:
        start, end = events[n % depth]
        n += 1
        pending.append((time.time(), start, end))
        ck(cu.cuEventRecord(start, stream), "cuEventRecord")
        for ns in kernels:
            launch(ns)
        ck(cu.cuEventRecord(end, stream), "cuEventRecord")
        if len(pending) < depth:
            now = time.time()
            continue
        now = wait_oldest()
        due += cycle_s
        if due < now:                     # behind (time-sliced, or 100 %): no catching up
            due = now
        elif min(due, stop_at) > now:
            time.sleep(min(due, stop_at) - now)
            now = time.time()
    while pending:
        now = wait_oldest()
    # To the end of the last cycle: a run that stops inside a cycle's idle
    # part (--seconds not a whole number of cycles) still ran its duty.
    seconds = max(now, due) - go
    job_util.emit({
        "duty": args.duty, "cycle_ms": args.cycle_ms, "kernel_ms": args.kernel_ms,
        "kernels_per_cycle": len(kernels), "blocks": blocks, "alloc_mib": args.alloc_mib,
        "go": round(go, 6), "first_launch": bursts[0][0] if bursts else None,
        "last_end": bursts[-1][1] if bursts else None, "cycles": len(bursts),
        "busy_s": round(busy_ms / 1000, 4), "seconds": round(seconds, 4),
        "busy_pct": round(busy_ms / 10 / seconds, 2) if seconds > 0 else None,
        "bursts": bursts,
    })


if __name__ == "__main__":
    main()
