"""Proof step 2, compute: two jobs at `--core 30` and `--core 60` (hard) on
one GPU each get that share of it, measured by their own throughput.

    python3 bench/gpu/compute.py [--out DIR] [--seconds 20] [--settle 3]
                                 [--only burn,burngraph,matmul,graph] [--tolerance 3]

For each workload:

  burn     vgpu-burn, spin kernels of --kernel-us (1000) us through the
           driver API; its own count of kernels completed over its whole run
           (settle + seconds)
  burngraph the same kernels as CUDA graphs of --graph-k (4) captured
           kernels (vgpu-burn --graph): one cuGraphLaunch per graph, no
           torch
  matmul   job_matmul.py: a PyTorch bf16 matmul loop (--size 8192), matmuls
           completed over `--seconds` after `--settle`, the jobs started
           together (a barrier)
  graph    the same as replays of a CUDA graph of --graph-k (4) matmuls
           (torch.cuda.graph): one cuGraphLaunch per replay

first run alone and bare (no vgpuctl: the unthrottled throughput), then as
two jobs at once, `vgpuctl run --core 30 --policy hard` and `--core 60`.
A job's measured share = its throughput / the solo throughput; pass: within
±`--tolerance` (3) percentage points of its --core. The daemon's own view
(`vgpuctl ps --json` core_measured, mid-run) is recorded beside it, not
judged. Writes compute.json. Default length: about 3 minutes.

vgpu-burn's kernel spins on the GPU's wall clock (%globaltimer): when the
two jobs' kernels time-slice, a kernel still ends on time, so its count
measures how many kernels the gate let through, not SM work. The matmul
loops measure work done.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C

KINDS = ("burn", "burngraph", "matmul", "graph")


class Workload:
    def __init__(self, kind: str, args: argparse.Namespace) -> None:
        self.kind = kind
        self.a = args

    @property
    def torch(self) -> bool:
        return self.kind not in ("burn", "burngraph")

    def argv(self, barrier: C.Barrier | None, name: str) -> list[str]:
        a = self.a
        if self.kind in ("burn", "burngraph"):
            graph = ["--graph", str(a.graph_k)] if self.kind == "burngraph" else []
            return [C.burn_program(), "--kernel-us", f"{a.kernel_us:g}",
                    "--seconds", f"{a.settle + a.seconds:g}", *graph]
        cmd = [C.PY, C.job_program("job_matmul.py"), "--size", str(a.size),
               "--settle", f"{a.settle:g}", "--seconds", f"{a.seconds:g}"]
        if self.kind == "graph":
            cmd += ["--graph", str(a.graph_k)]
        if barrier is not None:
            cmd += barrier.args(name)
        return cmd

    @property
    def unit(self) -> str:
        return "kernels/s" if not self.torch else "matmuls/s"

    def timeout(self) -> float:
        return self.a.settle + self.a.seconds + (150 if self.torch else 30)


def run_set(w: Workload, d: C.Daemon, jobs: list[tuple[str, int | None]]) -> dict[str, Any]:
    """Run the workload once per (name, core): core None = bare, no vgpuctl;
    all at once. Returns per name the result JSON (or an error), plus a
    mid-run `vgpuctl ps --json` snapshot of the jobs."""
    barrier = C.Barrier(d.tmp) if w.torch else None
    procs = []
    t0 = time.monotonic()
    for name, core in jobs:
        cmd = w.argv(barrier, name)
        if core is None:
            argv, env = cmd, C.base_env()
        else:
            argv = d.run_argv(cmd, mem=w.a.mem, core=core, policy="hard", name=name)
            env = d.job_env()
        procs.append((name, argv, C.start(argv, env)))
    out: dict[str, Any] = {"snapshot": None}
    try:
        if barrier is not None:
            barrier.wait_ready([n for n, _ in jobs], [p for _, _, p in procs], 150)
            barrier.go()
        t_go = time.monotonic()
        if any(core is not None for _, core in jobs):
            mid = t_go + w.a.settle + w.a.seconds / 2
            while time.monotonic() < mid and all(p.poll() is None for _, _, p in procs):
                time.sleep(min(0.2, max(0.0, mid - time.monotonic())))
            snap = d.jobs_named([n for n, _ in jobs])
            out["snapshot"] = {n: {k: j.get(k) for k in ("id", "core", "core_measured",
                                                          "launches", "throttled_s", "mem_used",
                                                          "policy")}
                               for n, j in snap.items()}
    except Exception as e:  # noqa: BLE001 - recorded; the jobs are stopped
        out["harness_error"] = f"{type(e).__name__}: {e}"
        for _, _, p in procs:
            C.stop(p)
    for name, argv, p in procs:
        r = C.finish(p, argv, max(1.0, w.timeout() - (time.monotonic() - t0)), t0)
        out[name] = {"rc": r.rc, "result": r.json, "log": r.log()}
    return out


def rate_of(entry: dict[str, Any]) -> float | None:
    j = entry.get("result") or {}
    if entry.get("rc") != 0 or j.get("error") or not j.get("rate"):
        return None
    return float(j["rate"])


def measure(res: C.StepResult, d: C.Daemon, w: Workload, shares: list[int]) -> None:
    """Solo, then the jobs at `shares` at once; one check per job."""
    kind, args = w.kind, w.a
    claims = {core: f"{kind} job at --core {core} hard, run with jobs at --core "
                    f"{'/'.join(map(str, shares))}: throughput / solo throughput "
                    f"within ±{args.tolerance:g} points of {core} %"
              for core in shares}
    if w.torch and not C.torch_installed():
        for core in shares:
            res.add(C.skipped(f"{kind}-{core}", claims[core], "torch not installed"))
        return
    solo = run_set(w, d, [(f"{kind}-solo", None)])
    fig: dict[str, Any] = {"unit": w.unit}
    res.figures[kind] = fig
    entry = solo[f"{kind}-solo"]
    res.logs[f"{kind}-solo"] = entry.pop("log")
    fig["solo"] = entry
    solo_rate = rate_of(entry)
    if solo_rate is None:
        for core in shares:
            res.add(C.errored(f"{kind}-{core}", claims[core],
                              "the solo run gave no throughput", entry.get("result")))
        return
    names = [(f"{kind}-{core}", core) for core in shares]
    pair = run_set(w, d, names)
    fig["snapshot"] = pair.get("snapshot")
    if pair.get("harness_error"):
        fig["harness_error"] = pair["harness_error"]
    for (name, core) in names:
        e = pair[name]
        res.logs[name] = e.pop("log")
        fig[name] = e
        rate = rate_of(e)
        if rate is None:
            res.add(C.errored(name, claims[core], f"no throughput (rc={e.get('rc')})",
                              e.get("result")))
            continue
        share = rate / solo_rate * 100
        e["share_pct"] = round(share, 2)
        res.add(C.judged(name, claims[core], abs(share - core) <= args.tolerance, {
            "share_pct": round(share, 2), "error_points": round(share - core, 2),
            "rate": round(rate, 3), "solo_rate": round(solo_rate, 3),
            "daemon_core_measured": ((fig["snapshot"] or {}).get(name) or {})
            .get("core_measured")}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(C.DEFAULT_OUT))
    ap.add_argument("--seconds", type=float, default=20.0, help="measured window")
    ap.add_argument("--settle", type=float, default=3.0, help="before the window")
    ap.add_argument("--only", default=",".join(KINDS), help="comma-separated: " + ",".join(KINDS))
    ap.add_argument("--shares", default="30,60", help="the two jobs' --core")
    ap.add_argument("--tolerance", type=float, default=3.0, help="percentage points")
    ap.add_argument("--kernel-us", type=float, default=1000.0, help="vgpu-burn's kernel")
    ap.add_argument("--size", type=int, default=8192, help="matmul size (bf16)")
    ap.add_argument("--graph-k", type=int, default=4,
                    help="matmuls (graph) or kernels (burngraph) per graph launch")
    ap.add_argument("--mem", default="4G", help="each job's memory limit")
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.only.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        ap.error(f"--only: unknown {bad}; choose from {', '.join(KINDS)}")
    shares = [int(x) for x in args.shares.split(",")]
    res = C.StepResult("compute", {k: v for k, v in vars(args).items() if k != "out"})
    print(f"compute: device {C.device_brief().get('name')}, {args.settle:g} s settle + "
          f"{args.seconds:g} s per run, shares {shares}", flush=True)

    def body(d: C.Daemon) -> None:
        for kind in kinds:
            measure(res, d, Workload(kind, args), shares)

    return C.run_step(res, args.out, body)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
