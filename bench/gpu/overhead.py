"""Proof step 3, overhead: a PyTorch training loop under `vgpuctl run --core
100` is at most 1 % slower than bare.

    python3 bench/gpu/overhead.py [--out DIR] [--runs 5] [--steps 500]
                                  [--limit-pct 1]

job_train.py (a small torch.nn.TransformerEncoder, bf16 autocast, AdamW,
random data; see its --help) run `--runs` times bare and `--runs` times as
`vgpuctl run --mem 8G --core 100 -- ...`, alternated (the order flips each
round, so drift hits both alike). A run's figure is its own timing of
`--steps` steps after a warm-up (Python start-up and model build excluded:
that is `bench/run_overhead.py`'s subject). Pass: median job time <=
median bare time x (1 + limit). Writes overhead.json. About 1.5 minutes.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(C.DEFAULT_OUT))
    ap.add_argument("--runs", type=int, default=5, help="runs each way")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--limit-pct", type=float, default=1.0)
    ap.add_argument("--mem", default="8G", help="the job's memory limit")
    args = ap.parse_args(argv)
    res = C.StepResult("overhead", {k: v for k, v in vars(args).items() if k != "out"})
    claim = (f"median training time under `vgpuctl run --core 100` <= bare x "
             f"{1 + args.limit_pct / 100:g} ({args.runs} alternated runs each)")
    print(f"overhead: device {C.device_brief().get('name')}", flush=True)
    if not C.torch_installed():
        res.add(C.skipped("train-overhead", claim, "torch not installed"))
        res.write(args.out)
        return 0

    def body(d: C.Daemon) -> None:
        cmd = [C.PY, C.job_program("job_train.py"), "--steps", str(args.steps),
               "--warmup", str(args.warmup)]
        runs: dict[str, list[dict[str, Any]]] = {"bare": [], "job": []}
        res.figures["runs"] = runs
        for i in range(args.runs):
            order = ("bare", "job") if i % 2 == 0 else ("job", "bare")
            for how in order:
                if how == "bare":
                    r = C.run(cmd, C.base_env(), 300)
                else:
                    r = C.run(d.run_argv(cmd, mem=args.mem, core=100, name=f"train-{i}"),
                              d.job_env(), 300)
                j = r.json or {}
                runs[how].append({"round": i, "rc": r.rc, "seconds": j.get("seconds"),
                                  "steps_per_s": j.get("steps_per_s"), "loss": j.get("loss"),
                                  "error": j.get("error") or (None if r.rc == 0 else
                                                              C.tail(r.stderr, 300))})
                res.logs[f"{how}-{i}"] = r.log()
                print(f"  round {i} {how:4}: rc={r.rc} seconds={j.get('seconds')}", flush=True)
        times = {how: [x["seconds"] for x in rs if x["rc"] == 0 and x["seconds"]]
                 for how, rs in runs.items()}
        if len(times["bare"]) < args.runs or len(times["job"]) < args.runs:
            errors = sorted({str(x["error"]) for rs in runs.values() for x in rs if x["error"]})
            res.add(C.errored("train-overhead", claim, "some runs failed: " + "; ".join(errors),
                              {k: len(v) for k, v in times.items()}))
            return
        mb, mj = C.median(times["bare"]), C.median(times["job"])
        slower = (mj / mb - 1) * 100
        res.figures.update(median_bare_s=mb, median_job_s=mj, slower_pct=slower)
        res.add(C.judged("train-overhead", claim, slower <= args.limit_pct, {
            "median_bare_s": round(mb, 4), "median_job_s": round(mj, 4),
            "slower_pct": round(slower, 3), "bare_s": times["bare"], "job_s": times["job"]}))

    return C.run_step(res, args.out, body)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
