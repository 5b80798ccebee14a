"""Job program: a PyTorch matmul loop, plain or as CUDA-graph replays, that
reports its own throughput over a window.

    python3 job_matmul.py [--size 8192] [--dtype bf16] [--graph K]
                          [--settle 3] [--seconds 20] [--barrier DIR --name N]

Warms up, waits for the harness's go (with --barrier), runs `--settle`
seconds, then counts matmuls completed over `--seconds` (with at most four
steps queued, so what is counted is done, not queued). With `--graph K` a
step is one replay of a captured graph of K matmuls (`torch.cuda.graph`),
that is one cuGraphLaunch. Prints one JSON line: rate (matmuls/s), tflops.
"""

from __future__ import annotations

import argparse
import time

import job_util


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    ap.add_argument("--graph", type=int, default=0, metavar="K",
                    help="replay a CUDA graph of K matmuls per step (0: no graph)")
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    job_util.add_barrier_args(ap)
    args = ap.parse_args()
    torch = job_util.torch_cuda()
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    n = args.size
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", dtype=dt, generator=g)
    b = torch.randn(n, n, device="cuda", dtype=dt, generator=g)
    c = torch.empty(n, n, device="cuda", dtype=dt)

    def body() -> None:
        for _ in range(max(1, args.graph)):
            torch.matmul(a, b, out=c)

    if args.graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                body()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            body()
        step = graph.replay
        per_step = args.graph
    else:
        step = body
        per_step = 1
    for _ in range(5):
        step()
    torch.cuda.synchronize()

    job_util.wait_barrier(args)
    ring = job_util.Ring(torch)
    t_start = time.perf_counter()
    while time.perf_counter() < t_start + args.settle:
        ring.issue(step)
    torch.cuda.synchronize()
    ta, na = time.perf_counter(), ring.n
    while time.perf_counter() < ta + args.seconds:
        ring.issue(step)
    torch.cuda.synchronize()
    tb, nb = time.perf_counter(), ring.n
    window = tb - ta
    done = (nb - na) * per_step
    rate = done / window if window > 0 else 0.0
    job_util.emit({
        "name": args.name, "torch": torch.__version__, "size": n, "dtype": args.dtype,
        "graph": args.graph, "matmuls": done, "window_s": round(window, 4),
        "rate": rate, "tflops": rate * 2 * n ** 3 / 1e12,
        "wall_start": time.time() - (time.perf_counter() - t_start),
    })


if __name__ == "__main__":
    main()
