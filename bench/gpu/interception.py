"""Proof step 4, interception: the CUDA runtime's own path into the driver
(dlopen + cuGetProcAddress, as PyTorch's cudaMalloc takes it) goes through
the hook, shown by the hook's counters, not assumed.

    python3 bench/gpu/interception.py [--out DIR]

  torch-runtime   job_intercept.py under `vgpuctl run --mem 4G`: allocates
                  256 MiB with torch and runs a kernel, then reads its own
                  process slot in the job's region (VGPU_REGION):
                  get_proc_calls > 0, allocs > 0, used >= 256 MiB,
                  launches > 0
  burn-driver     vgpu-burn (dlopen + cuGetProcAddress, like the runtime)
                  with --alloc 64M under `vgpuctl run`: the harness reads the
                  job's region while it runs (the region folder printed by
                  the job itself): the same counters for its pid

Writes interception.json.
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

CLAIM_TORCH = ("torch's cudaMalloc and kernel under vgpuctl run are seen by the hook: "
               "get_proc_calls > 0, allocs > 0, used >= the tensor, launches > 0")
CLAIM_BURN = ("vgpu-burn's driver calls through cuGetProcAddress are seen by the hook: "
              "get_proc_calls > 0, allocs > 0, used >= 64 MiB, launches > 0")


def torch_check(res: C.StepResult, d: C.Daemon) -> None:
    if not C.torch_installed():
        res.add(C.skipped("torch-runtime", CLAIM_TORCH, "torch not installed"))
        return
    r = C.run(d.run_argv([C.PY, C.job_program("job_intercept.py"), "--mib", "256"],
                         mem="4G", name="intercept"), d.job_env(), 180)
    res.logs["torch-runtime"] = r.log()
    j = r.json
    if j is None or j.get("error"):
        res.add(C.errored("torch-runtime", CLAIM_TORCH,
                          (j or {}).get("error") or f"no result (rc={r.rc})", j))
        return
    res.figures["torch-runtime"] = j
    ok = (j["get_proc_calls"] > 0 and j["allocs"] > 0 and (j["used"] or 0) >= 256 * C.MiB
          and (j["launches"] or 0) > 0 and j["kernel_result_ok"])
    res.add(C.judged("torch-runtime", CLAIM_TORCH, ok, {
        k: j.get(k) for k in ("get_proc_calls", "allocs", "used", "launches", "ctx_bytes",
                              "libraries")}))


def burn_check(res: C.StepResult, d: C.Daemon) -> None:
    from vgpuctl.system.region import Region

    script = ('echo "region=$VGPU_REGION"; exec "$0" --alloc 64M --kernel-us 1000 '
              '--seconds 4')
    argv = d.run_argv(["/bin/sh", "-c", script, C.burn_program()], mem="1G",
                      name="intercept-burn")
    p = C.start(argv, d.job_env())
    t0 = time.monotonic()
    seen: dict[str, Any] = {}
    try:
        assert p.stdout is not None
        line = p.stdout.readline().strip()
        if not line.startswith("region="):
            raise RuntimeError(f"the job printed {line!r}, not its region")
        region_dir = line.partition("=")[2]

        def slot() -> Any:
            try:
                u = Region.open(region_dir).read_usage()
            except (OSError, ValueError):
                return None
            for s in u.procs:
                if s.allocs > 0 and s.launches and s.launches[0] > 0:
                    return s
            return None

        s = C.wait_for(slot, 15, "vgpu-burn's slot with an allocation and launches", 0.1)
        seen = {"pid": s.pid, "get_proc_calls": s.get_proc_calls, "allocs": s.allocs,
                "used": s.used[0], "launches": s.launches[0], "region": region_dir}
    except Exception as e:  # noqa: BLE001
        seen["harness_error"] = f"{type(e).__name__}: {e}"
    r = C.finish(p, argv, max(1.0, 30 - (time.monotonic() - t0)), t0)
    res.logs["burn-driver"] = r.log()
    j = r.json or {}
    seen["burn_pid"] = j.get("pid")
    res.figures["burn-driver"] = seen
    if "harness_error" in seen:
        res.add(C.errored("burn-driver", CLAIM_BURN, seen["harness_error"], seen))
        return
    ok = (seen["pid"] == j.get("pid") and seen["get_proc_calls"] > 0 and seen["allocs"] > 0
          and seen["used"] >= 64 * C.MiB and seen["launches"] > 0)
    res.add(C.judged("burn-driver", CLAIM_BURN, ok, seen))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(C.DEFAULT_OUT))
    args = ap.parse_args(argv)
    res = C.StepResult("interception", {})
    print(f"interception: device {C.device_brief().get('name')}", flush=True)

    def body(d: C.Daemon) -> None:
        torch_check(res, d)
        burn_check(res, d)

    return C.run_step(res, args.out, body)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
