"""Proof step 1, memory: under `vgpuctl run --mem 4G` a job sees a 4 GiB GPU
and cannot hold more.

    python3 bench/gpu/memory.py [--out DIR] [--mem 4G]

Checks (each job started as users start them, `vgpuctl run --mem 4G -- ...`,
under a private daemon):

  torch-total        torch.cuda.mem_get_info() total == 4 GiB exactly
  torch-oom          allocating 256 MiB chunks stops with torch.OutOfMemoryError
                     after at most 4 GiB (and more than 2 GiB); one block larger
                     than the total fails the same way; the process still works
  expandable-*       the same two with PYTORCH_CUDA_ALLOC_CONF=
                     expandable_segments:True (cuMemCreate/cuMemMap path)
  nvidia-smi         `nvidia-smi --query-gpu=memory.total,memory.used` inside
                     the job reports 4096 MiB total (bare nvidia-smi for contrast)
  burn-oom           `vgpu-burn --alloc 5G` inside the job gets
                     CUDA_ERROR_OUT_OF_MEMORY; controls: --alloc 2G inside the
                     job and --alloc 5G bare both succeed

PyTorch checks are skipped where torch is not installed, nvidia-smi's on the
simulated GPU. Writes memory.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C

from vgpuctl.core.sizes import format_size, parse_size


def torch_checks(res: C.StepResult, d: C.Daemon, mem: str, limit: int, expandable: bool) -> None:
    prefix = "expandable-" if expandable else "torch-"
    claim_total = f"torch.cuda.mem_get_info() total == {limit} ({mem})"
    claim_oom = (f"filling the GPU stops with torch.OutOfMemoryError after <= {mem} "
                 "(> half of it); a block > total fails the same way; still computes")
    if not C.torch_installed():
        res.add(C.skipped(prefix + "total", claim_total, "torch not installed"))
        res.add(C.skipped(prefix + "oom", claim_oom, "torch not installed"))
        return
    extra = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"} if expandable else {}
    r = C.run(d.run_argv([C.PY, C.job_program("job_torch_mem.py")], mem=mem,
                         name=prefix + "mem"), d.job_env(extra), 180)
    res.logs[prefix + "job"] = r.log()
    j = r.json
    if j is None or j.get("error"):
        why = (j or {}).get("error") or f"no result (rc={r.rc}): {C.tail(r.stderr, 300)}"
        res.add(C.errored(prefix + "total", claim_total, why))
        res.add(C.errored(prefix + "oom", claim_oom, why))
        return
    res.figures[prefix + "job"] = j
    res.add(C.judged(prefix + "total", claim_total, j["total"] == limit,
                     {"total": j["total"], "free_before": j["free_before"]}))
    got = j["allocated_before_failure"]
    ok = (j["failure_is_torch_oom"] and limit // 2 < got <= limit
          and j["big_failure_is_torch_oom"] and j["still_works"])
    res.add(C.judged(prefix + "oom", claim_oom, ok, {
        "allocated_before_failure": got, "failure": j["failure"],
        "big_request": j["big_request"], "big_failure": j["big_failure"],
        "still_works": j["still_works"]}))


def nvidia_smi_check(res: C.StepResult, d: C.Daemon, mem: str, limit: int) -> None:
    claim = f"nvidia-smi inside the job shows memory.total == {limit // C.MiB} MiB"
    smi = shutil.which("nvidia-smi")
    if C.simulated():
        res.add(C.skipped("nvidia-smi", claim, "simulated GPU: nvidia-smi reads the real driver"))
        return
    if smi is None:
        res.add(C.skipped("nvidia-smi", claim, "nvidia-smi not found"))
        return
    q = [smi, "--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits"]
    bare = C.run(q, C.base_env(), 60)
    job = C.run(d.run_argv(q, mem=mem, name="nvidia-smi"), d.job_env(), 60)
    res.logs["nvidia-smi-bare"] = bare.log()
    res.logs["nvidia-smi-job"] = job.log()

    def parse(text: str) -> list[int] | None:
        for line in text.strip().splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and all(p.isdigit() for p in parts):
                return [int(parts[0]), int(parts[1])]
        return None

    b, jv = parse(bare.stdout), parse(job.stdout)
    measured = {"job_total_mib": jv[0] if jv else None, "job_used_mib": jv[1] if jv else None,
                "bare_total_mib": b[0] if b else None, "bare_used_mib": b[1] if b else None}
    if jv is None:
        res.add(C.errored("nvidia-smi", claim, f"no figures from nvidia-smi in the job "
                          f"(rc={job.rc}): {C.tail(job.stdout + job.stderr, 300)}", measured))
        return
    res.add(C.judged("nvidia-smi", claim, jv[0] == limit // C.MiB, measured))


def burn_checks(res: C.StepResult, d: C.Daemon, mem: str, limit: int) -> None:
    over = format_size(limit + C.GiB)
    under = format_size(max(C.GiB // 2, limit // 2))
    claim = f"vgpu-burn --alloc {over} inside a {mem} job fails with CUDA_ERROR_OUT_OF_MEMORY"
    burn = C.burn_program()

    def cmd(size: str) -> list[str]:
        return [burn, "--alloc", size, "--kernel-us", "100", "--count", "10"]

    r_over = C.run(d.run_argv(cmd(over), mem=mem, name="burn-over"), d.job_env(), 60)
    r_under = C.run(d.run_argv(cmd(under), mem=mem, name="burn-under"), d.job_env(), 60)
    r_bare = C.run(cmd(over), C.base_env(), 60)
    for k, r in (("burn-over", r_over), ("burn-under", r_under), ("burn-bare", r_bare)):
        res.logs[k] = r.log()
    jo, ju, jb = r_over.json or {}, r_under.json or {}, r_bare.json or {}
    oom = jo.get("error") == "CUDA_ERROR_OUT_OF_MEMORY" and jo.get("call") == "cuMemAlloc"
    res.add(C.judged("burn-oom", claim, oom,
                     {"error": jo.get("error"), "call": jo.get("call"), "rc": r_over.rc}))
    res.add(C.judged("burn-control-in-job", f"vgpu-burn --alloc {under} inside the job succeeds",
                     r_under.rc == 0 and not ju.get("error"),
                     {"rc": r_under.rc, "error": ju.get("error"), "kernels": ju.get("kernels")}))
    dev_total = C.device_brief().get("memory_total") or 0
    if dev_total and dev_total < limit + 2 * C.GiB:
        res.add(C.skipped("burn-control-bare", f"vgpu-burn --alloc {over} bare succeeds",
                          f"the GPU has only {format_size(dev_total)}"))
    else:
        res.add(C.judged("burn-control-bare", f"vgpu-burn --alloc {over} bare succeeds",
                         r_bare.rc == 0 and not jb.get("error"),
                         {"rc": r_bare.rc, "error": jb.get("error")}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(C.DEFAULT_OUT))
    ap.add_argument("--mem", default="4G", help="the job's memory limit")
    args = ap.parse_args(argv)
    limit = parse_size(args.mem)
    res = C.StepResult("memory", {"mem": args.mem, "limit": limit})
    print(f"memory: device {C.device_brief().get('name')}, limit {args.mem}", flush=True)

    def body(d: C.Daemon) -> None:
        for expandable in (False, True):
            torch_checks(res, d, args.mem, limit, expandable)
        nvidia_smi_check(res, d, args.mem, limit)
        burn_checks(res, d, args.mem, limit)

    return C.run_step(res, args.out, body)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
