"""Proof step, suspend: `vgpuctl suspend` and `resume` through the driver's
checkpoint API, with PyTorch and CuPy jobs holding 1, 4 and 8 GiB, their
data and a computation checked after each resume; on two GPUs or more, a
move too (`resume --gpu`).

    python3 bench/gpu/suspend.py [--out DIR] [--sizes 1G,4G,8G] [--kinds torch,cupy]
                                 [--repeat 1]

Checks (each job started as users start them, `vgpuctl run`, under a
private daemon):

  available          `vgpuctl doctor`'s suspend check: the driver offers the
                     checkpoint API (R570), and a move (R580)
  <kind>-<size>      suspend, then resume on the same GPU: the job's every
                     byte (CRC-32 of all of it, copied back) and a matrix
                     product computed again are what they were; while
                     suspended the job shows `suspended` and its GPU's
                     memory in use drops by about what it held (NVML)
  <kind>-<size>-move on two GPUs or more: resume on another GPU, the same
                     checks, and the driver names the new GPU

Figures: per job, suspend and resume wall time (the client's request to the
daemon's reply: lock, checkpoint or restore, unlock), and the rate they
imply. Writes suspend.json. On the simulated GPU the copies take the time
VGPU_SIM_CKPT_RATE gives them (bench/suspend.py runs this step there).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C

from vgpuctl.core.sizes import format_size, parse_size


class Job:
    """job_suspend.py under `vgpuctl run`, talked to through its pipes."""

    count = 0

    def __init__(self, d: C.Daemon, kind: str, size: int, mem: int) -> None:
        Job.count += 1
        self.name = f"{kind}-{size >> 30}g-{Job.count}"
        argv = d.run_argv([C.PY, C.job_program("job_suspend.py"), kind, str(size)],
                          mem=str(mem // C.MiB) + "M", name=self.name)
        self.proc = subprocess.Popen(argv, env=d.job_env(), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.sel = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        self.fd = self.proc.stdout.fileno()
        self.sel.register(self.fd, selectors.EVENT_READ)
        self.buf = b""

    def reply(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sel.select(left):
                raise TimeoutError(f"the job said nothing within {timeout:g} s")
            chunk = os.read(self.fd, 65536)
            if not chunk:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise RuntimeError(f"the job ended (rc={self.proc.wait()}): {C.tail(err, 600)}")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        out = json.loads(line)
        if out.get("error"):
            raise RuntimeError(f"the job failed: {out['error']}")
        return out

    def check(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("check\n")
        self.proc.stdin.flush()
        return self.reply(timeout)

    def close(self) -> None:
        if self.proc.stdin:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        C.stop(self.proc, 20)


def _call(d: C.Daemon, op: str, **fields: Any) -> tuple[float, dict[str, Any]]:
    from vgpuctl.client.connection import Client

    t0 = time.monotonic()
    with Client.connect(d.socket, timeout=600) as cl:
        reply = cl.call(op, **fields)
    return time.monotonic() - t0, reply


def _gpu_used(d: C.Daemon) -> dict[int, int | None]:
    data = d.ps() or {}
    return {g["index"]: g.get("memory_used") for g in data.get("gpus", [])}


def _job_id(d: C.Daemon, name: str) -> str:
    return C.wait_for(lambda: (d.jobs_named([name]).get(name) or {}).get("id"), 60,
                      f"job {name} in ps")


def one(res: C.StepResult, d: C.Daemon, kind: str, size: int, move_to: int | None,
        repeat: int) -> None:
    name = f"{kind}-{format_size(size)}" + ("-move" if move_to is not None else "")
    claim = (f"a {kind} job holding {format_size(size)}: after suspend and resume"
             + (f" on GPU {move_to}" if move_to is not None else "")
             + " every byte and a computation are what they were")
    job = Job(d, kind, size, size + (2 << 30))
    figures: dict[str, Any] = {"kind": kind, "size": size, "suspend_s": [], "resume_s": []}
    try:
        ready = job.reply(300)
        jid = _job_id(d, job.name)
        ok = True
        detail = []
        for i in range(repeat):
            before = _gpu_used(d)
            t_s, _ = _call(d, "suspend", job=jid)
            state = (d.ps() or {}).get("jobs", [])
            state = next((j["state"] for j in state if j["id"] == jid), None)
            time.sleep(1.0)   # NVML's memory figure is the daemon's last reading
            during = _gpu_used(d)
            target = None if move_to is None or i % 2 == 1 else str(move_to)
            t_r, reply = _call(d, "resume", job=jid, gpu=target)
            after = job.check(300)
            figures["suspend_s"].append(round(t_s, 3))
            figures["resume_s"].append(round(t_r, 3))
            gpu = (reply.get("outcome") or {}).get("gpu")
            figures.setdefault("gpus", []).append(gpu)
            figures.setdefault("freed", []).append(
                None if before.get(0) is None or during.get(0) is None
                else before[0] - during[0])
            same = after["digest"] == ready["ready"] and after["result"] == ready["result"]
            if state != "suspended":
                ok = False
                detail.append(f"round {i}: ps said {state!r} while suspended")
            if not same:
                ok = False
                detail.append(f"round {i}: {after} != {ready}")
            if target is not None and gpu != move_to:
                ok = False
                detail.append(f"round {i}: resumed on GPU {gpu}, not {move_to}")
            figures.setdefault("uuids", []).append(after["uuid"])
        s, r = C.median(figures["suspend_s"]), C.median(figures["resume_s"])
        figures["suspend_median_s"] = s
        figures["resume_median_s"] = r
        figures["suspend_gib_per_s"] = round(size / (1 << 30) / s, 2) if s > 0 else None
        figures["resume_gib_per_s"] = round(size / (1 << 30) / r, 2) if r > 0 else None
        res.figures[name] = figures
        res.add(C.judged(name, claim, ok, {"suspend_s": figures["suspend_s"],
                                           "resume_s": figures["resume_s"]},
                         "; ".join(detail)))
    except Exception as e:  # noqa: BLE001 - recorded as an error check
        res.figures[name] = figures
        res.add(C.errored(name, claim, f"{type(e).__name__}: {e}"))
    finally:
        job.close()
        res.logs[name] = C.tail(job.proc.stderr.read() if job.proc.stderr else "", 1500)


def availability() -> dict[str, Any]:
    from vgpuctl.system import checkpoint

    a = checkpoint.availability()
    return {"cuda": a.cuda, "suspend": a.suspend, "move": a.move, "why": a.why,
            "why_move": a.why_move}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(C.DEFAULT_OUT))
    ap.add_argument("--sizes", default="1G,4G,8G", help="PyTorch jobs' sizes")
    ap.add_argument("--cupy-sizes", default="1G", help="CuPy jobs' sizes")
    ap.add_argument("--kinds", default="torch,cupy")
    ap.add_argument("--repeat", type=int, default=1, help="suspend/resume rounds per job")
    args = ap.parse_args(argv)
    by_kind = {"torch": [parse_size(s) for s in args.sizes.split(",") if s],
               "cupy": [parse_size(s) for s in args.cupy_sizes.split(",") if s]}
    kinds = [k for k in args.kinds.split(",") if k]
    res = C.StepResult("suspend", {"sizes": by_kind, "kinds": kinds, "repeat": args.repeat})
    print(f"suspend: device {C.device_brief().get('name')}, sizes {args.sizes}", flush=True)

    def body(d: C.Daemon) -> None:
        sys.path.insert(0, str(C.ROOT))
        from vgpuctl.system import sim

        sim.use_in_process()
        a = availability()
        res.figures["availability"] = a
        if not a["suspend"]:
            res.add(C.skipped("available", "the driver offers the checkpoint API (R570)",
                              a["why"] or "not available"))
            return
        res.add(C.judged("available", "the driver offers the checkpoint API (R570)", True, a))
        gpus = C.device_brief().get("gpus") or 1
        for kind in kinds:
            sizes = by_kind.get(kind) or [1 << 30]
            if kind == "torch" and not C.torch_installed():
                res.add(C.skipped(f"{kind}", "PyTorch jobs survive suspend", "no torch"))
                continue
            if kind == "cupy" and importlib.util.find_spec("cupy") is None:
                res.add(C.skipped(f"{kind}", "CuPy jobs survive suspend", "no cupy"))
                continue
            for size in sizes:
                one(res, d, kind, size, None, args.repeat)
            if gpus >= 2 and a["move"]:
                one(res, d, kind, sizes[0], 1, 2)
            else:
                res.add(C.skipped(f"{kind}-move", "a job moved to another GPU is intact",
                                  "one GPU" if gpus < 2 else (a["why_move"] or "no move")))

    return C.run_step(res, args.out, body)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
