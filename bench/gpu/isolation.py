"""Proof step 5, fault isolation: a job whose kernel writes through a bad
pointer dies alone; a job beside it on the same GPU goes on with correct
results at unchanged speed (what MPS does not give).

    python3 bench/gpu/isolation.py [--out DIR] [--before 6] [--after 6]
                                   [--speed-tol-pct 5]

  A  job_checksum.py under `vgpuctl run --mem 8G --core 100`: fixed-seed
     fp32 matmuls whose every result must equal the first bit for bit (the
     first checked against float64 on the CPU), its progress sampled every
     50 ms
  B  job_bad_pointer.py under `vgpuctl run --mem 1G`, started `--before`
     seconds after A's go: cuda-bindings + a PTX kernel storing to 0x10

Checks: B dies with CUDA_ERROR_ILLEGAL_ADDRESS; A exits 0 with no mismatch;
A's iteration rate over the `--after` seconds after B ended is within
±`--speed-tol-pct` of its rate before B started (the rate while B ran is
recorded too). On the simulated GPU, which does not execute a kernel's
stores, B's check is skipped (B still runs, and its calls are recorded).
Writes isolation.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C

CLAIM_B = "B's kernel storing to a bad address ends B with CUDA_ERROR_ILLEGAL_ADDRESS"
CLAIM_A = "A ends normally, every iteration's result equal to the first, which matches fp64"
MAX_REL_ERR = 1e-4


def window_rate(timeline: Sequence[Sequence[float]], lo: float, hi: float) -> dict[str, Any]:
    pts = [(float(t), int(k)) for t, k in timeline if lo <= float(t) <= hi]
    if len(pts) < 2 or pts[-1][0] - pts[0][0] < 0.5:
        return {"rate": None, "span_s": None, "points": len(pts)}
    (t1, k1), (t2, k2) = pts[0], pts[-1]
    return {"rate": (k2 - k1) / (t2 - t1), "span_s": round(t2 - t1, 3), "points": len(pts)}


def judge_b(res: C.StepResult, rb: C.Ran) -> None:
    j = rb.json or {}
    res.figures["B"] = {"rc": rb.rc, "result": j}
    measured = {"rc": rb.rc, "error": j.get("error"), "failed": j.get("failed")}
    if C.simulated():
        res.add(C.skipped("bad-pointer-dies", CLAIM_B,
                          "the simulated GPU does not execute a kernel's stores"))
    elif j.get("error") == "cuda-bindings not installed":
        res.add(C.skipped("bad-pointer-dies", CLAIM_B, "cuda-bindings not installed"))
    else:
        res.add(C.judged("bad-pointer-dies", CLAIM_B,
                         rb.rc not in (0, None) and j.get("error") == "CUDA_ERROR_ILLEGAL_ADDRESS",
                         measured))


def isolate(res: C.StepResult, d: C.Daemon, args: argparse.Namespace) -> None:
    claim_speed = (f"A's iteration rate after B died within ±{args.speed_tol_pct:g} % "
                   "of its rate before B started")
    b_cmd = [C.PY, C.job_program("job_bad_pointer.py")]
    if not C.torch_installed():
        res.add(C.skipped("neighbour-correct", CLAIM_A, "torch not installed"))
        res.add(C.skipped("neighbour-speed", claim_speed, "torch not installed"))
        rb = C.run(d.run_argv(b_cmd, mem="1G", name="iso-B"), d.job_env(), 90)
        res.logs["B"] = rb.log()
        judge_b(res, rb)
        return
    barrier = C.Barrier(d.tmp)
    stop_file = barrier.dir / "stop"
    a_argv = d.run_argv([C.PY, C.job_program("job_checksum.py"), "--stop", str(stop_file),
                         "--size", str(args.size), "--max-seconds", "150",
                         *barrier.args("A")], mem="8G", core=100, name="iso-A")
    pa = C.start(a_argv, d.job_env())
    t0 = time.monotonic()
    t_go = t_b0 = t_b1 = 0.0
    try:
        barrier.wait_ready(["A"], [pa], 150)
        barrier.go()
        t_go = time.time()
        while time.time() < t_go + args.before and pa.poll() is None:
            time.sleep(0.05)
        t_b0 = time.time()
        rb = C.run(d.run_argv(b_cmd, mem="1G", name="iso-B"), d.job_env(), 90)
        t_b1 = time.time()
        res.logs["B"] = rb.log()
        judge_b(res, rb)
        while time.time() < t_b1 + args.after and pa.poll() is None:
            time.sleep(0.05)
    finally:
        stop_file.touch()
        if not (barrier.dir / "go").exists():
            barrier.go()            # A waits for it: let it see the stop file and end
        ra = C.finish(pa, a_argv, 90, t0)
        res.logs["A"] = ra.log()
    ja = ra.json or {}
    if ra.rc != 0 or ja.get("error") or "timeline" not in ja:
        why = ja.get("error") or f"A failed (rc={ra.rc})"
        res.add(C.Check("neighbour-correct", "fail" if ra.rc not in (0, None) else "error",
                        CLAIM_A, {"rc": ra.rc}, why))
        res.add(C.errored("neighbour-speed", claim_speed, why))
        return
    tl = ja.pop("timeline")
    t_end = tl[-1][0]
    rates = {"before": window_rate(tl, t_go + 1.0, t_b0),
             "during": window_rate(tl, t_b0, t_b1),
             "after": window_rate(tl, t_b1 + 0.5, t_end)}
    res.figures["A"] = {**ja, "rc": ra.rc, "rates": rates,
                        "b_start_s": round(t_b0 - t_go, 3), "b_end_s": round(t_b1 - t_go, 3),
                        "timeline": [(round(t - t_go, 3), k) for t, k in tl]}
    res.add(C.judged("neighbour-correct", CLAIM_A,
                     ja["mismatches"] == 0 and ja["final_equal"]
                     and ja["rel_err_vs_cpu_fp64"] < MAX_REL_ERR,
                     {"iterations": ja["iterations"], "mismatches": ja["mismatches"],
                      "checksum": ja["checksum"],
                      "rel_err_vs_cpu_fp64": ja["rel_err_vs_cpu_fp64"]}))
    before, after = rates["before"]["rate"], rates["after"]["rate"]
    if not before or not after:
        res.add(C.errored("neighbour-speed", claim_speed, "a window too short", rates))
        return
    change = (after / before - 1) * 100
    during = rates["during"]["rate"]
    res.add(C.judged("neighbour-speed", claim_speed, abs(change) <= args.speed_tol_pct,
                     {"before_it_s": round(before, 2), "after_it_s": round(after, 2),
                      "during_it_s": round(during, 2) if during else None,
                      "change_pct": round(change, 2)}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(C.DEFAULT_OUT))
    ap.add_argument("--before", type=float, default=6.0, help="seconds of A before B starts")
    ap.add_argument("--after", type=float, default=6.0, help="seconds of A after B ended")
    ap.add_argument("--speed-tol-pct", type=float, default=5.0)
    ap.add_argument("--size", type=int, default=4096, help="A's matrices (fp32)")
    args = ap.parse_args(argv)
    res = C.StepResult("isolation", {k: v for k, v in vars(args).items() if k != "out"})
    print(f"isolation: device {C.device_brief().get('name')}", flush=True)
    return C.run_step(res, args.out, lambda d: isolate(res, d, args))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
