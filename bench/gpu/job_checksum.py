"""Job program: a PyTorch loop with a known answer, timed iteration by
iteration, for the fault-isolation proof.

    python3 job_checksum.py --stop FILE [--size 4096] [--max-seconds 120]
                            [--barrier DIR --name N]

Fixed-seed fp32 matrices (TF32 off), C = A @ B every iteration. The first
result is checked against float64 on the CPU (a few rows); every later
iteration's result must equal it bit for bit (counted on the GPU, so the
check adds no synchronisation). Runs until FILE exists (or --max-seconds),
recording (wall time, iterations completed) every 50 ms. Prints one JSON
line: iterations, mismatches, the checksum, the timeline.
"""

from __future__ import annotations

import argparse
import os
import time

import job_util


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stop", required=True, help="end when this file exists")
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--max-seconds", type=float, default=120.0)
    ap.add_argument("--sample-ms", type=float, default=50.0)
    job_util.add_barrier_args(ap)
    args = ap.parse_args()
    torch = job_util.torch_cuda()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    n = args.size
    gen = torch.Generator().manual_seed(1234)
    a_cpu = torch.randn(n, n, generator=gen, dtype=torch.float32)
    b_cpu = torch.randn(n, n, generator=gen, dtype=torch.float32)
    a, b = a_cpu.cuda(), b_cpu.cuda()
    ref = a @ b
    rows = a_cpu[:8].double() @ b_cpu.double()
    rel_err = float((ref[:8].cpu().double() - rows).abs().max() / rows.abs().max())
    checksum = float(ref.double().sum().item())
    c = torch.empty_like(ref)
    bad = torch.zeros((), dtype=torch.int64, device="cuda")

    def step() -> None:
        torch.matmul(a, b, out=c)
        bad.add_(torch.ne(c, ref).any())

    for _ in range(3):
        step()
    torch.cuda.synchronize()

    job_util.wait_barrier(args)
    ring = job_util.Ring(torch)
    timeline: list[tuple[float, int]] = [(time.time(), 0)]
    every = args.sample_ms / 1e3
    t_end = time.monotonic() + args.max_seconds
    next_sample = time.monotonic() + every
    stopped_by = "max-seconds"
    while time.monotonic() < t_end:
        ring.issue(step)
        now = time.monotonic()
        if now >= next_sample:
            timeline.append((time.time(), ring.completed()))
            next_sample = now + every
            if os.path.exists(args.stop):
                stopped_by = "stop file"
                break
    torch.cuda.synchronize()
    timeline.append((time.time(), ring.n))
    final_equal = bool(torch.equal(c, ref))
    job_util.emit({
        "name": args.name, "torch": torch.__version__, "size": n,
        "iterations": ring.n, "mismatches": int(bad.item()), "final_equal": final_equal,
        "checksum": checksum, "rel_err_vs_cpu_fp64": rel_err, "stopped_by": stopped_by,
        "timeline": [(round(t, 4), k) for t, k in timeline],
    })


if __name__ == "__main__":
    main()
