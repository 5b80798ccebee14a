"""Suspend and resume time against a job's memory (1, 4, 8 GiB), on the
simulated GPU: `vgpuctl suspend` and `vgpuctl resume` (in place, and a move
to the other GPU) of CuPy jobs holding that much, each checked to hold every
byte afterwards.

    python bench/suspend.py [--sizes 1G,4G,8G] [--repeat 3] [--kinds cupy]

It runs the real-GPU step (bench/gpu/suspend.py) on a private simulated
machine (VGPU_SIM=2x80G unless set). The simulator's copies take the time
VGPU_SIM_CKPT_RATE gives them (20 GiB/s unless set), so what this measures
is that model plus everything vgpuctl adds around it: the request, finding
the job's processes, the driver's round trips to each process (lock,
checkpoint, restore, unlock), the region and record updates. Writes
bench/results/suspend.json, quoted in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "gpu"))
sys.path.insert(0, str(HERE.parent))

GiB = 1 << 30


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1G,4G,8G")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--kinds", default="cupy", help="cupy and/or torch")
    ap.add_argument("--out", default=str(HERE / "results" / "suspend.json"))
    args = ap.parse_args()
    os.environ.setdefault("VGPU_SIM", "2x80G")
    tmp = Path(tempfile.mkdtemp(prefix="vgpu-bench-suspend-"))
    os.environ.setdefault("VGPU_SIM_STATE", str(tmp / "sim-state"))
    import suspend as step  # bench/gpu/suspend.py

    rc = step.main(["--out", str(tmp), "--sizes", args.sizes, "--cupy-sizes", args.sizes,
                    "--kinds", args.kinds, "--repeat", str(args.repeat)])
    data = json.loads((tmp / "suspend.json").read_text())
    from vgpuctl.core.sizes import parse_size

    rate = float(parse_size(os.environ.get("VGPU_SIM_CKPT_RATE") or "20G"))
    rows = []
    for name, f in sorted(data["figures"].items()):
        if not isinstance(f, dict) or "suspend_s" not in f or not f["suspend_s"]:
            continue
        rows.append({"job": name, "kind": f["kind"], "size": f["size"],
                     "move": name.endswith("-move"),
                     "suspend_s": f["suspend_s"], "resume_s": f["resume_s"],
                     "suspend_median_s": f.get("suspend_median_s"),
                     "resume_median_s": f.get("resume_median_s"),
                     # the job's data alone at the simulator's rate (its context
                     # and pools come on top)
                     "modeled_copy_s": round(f["size"] / rate, 3)})
    out = {"benchmark": "suspend", "vgpu_sim": os.environ["VGPU_SIM"],
           "ckpt_rate_bytes_per_s": rate, "status": data["status"],
           "device": data["device"], "date": data["date"], "rows": rows,
           "checks": [{k: c[k] for k in ("name", "status", "detail")} for c in data["checks"]]}
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"{'job':<20} {'size':>6} {'suspend s':>10} {'resume s':>9} {'copy model s':>13}")
    for r in rows:
        print(f"{r['job']:<20} {r['size'] / GiB:>5.0f}G {r['suspend_median_s']:>10.3f} "
              f"{r['resume_median_s']:>9.3f} {r['modeled_copy_s']:>13.3f}")
    print(f"-> {args.out}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
