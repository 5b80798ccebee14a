"""Honest jobs under CPU load are never judged tampering; a job that rewrites
its tokens is, fast.

    python bench/tamper_verdicts.py [--rounds 50] [--forged 10]

Starts a private daemon over the simulated GPU, four CPU-burning processes
beside it (as a job's dataloaders make the normal case), then:

1. --rounds rounds, alternately of two `vgpu-burn` jobs (50 us and 200 us
   kernels, 8 in flight) and of two PyTorch training loops
   (bench/frameworks.py's), both on GPU 0, each round changing their shares
   down and up with `vgpuctl set --core` (and once `--mem`) while they run.
   A verdict is a job with `region_error` set, or a "tampered" line in the
   daemon's log. Target (issue 19): 0 in 50 rounds.
2. --forged times: a `vgpu-burn` job at --core 10, once gated, whose user
   writes a full bucket into its usage region again and again; the time from
   the first forged write to the daemon's verdict (its log line's time, the
   same clock). Target: within 0.1 s (a tick).

Writes bench/results/tamper_verdicts.json (or --out). PyTorch rounds need
torch (.ci/run installs the pinned one); without it every round is vgpu-burn.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from run_overhead import remove_regions, start_daemon, vgpuctl_argv  # noqa: E402

from vgpuctl.client.connection import Client  # noqa: E402
from vgpuctl.system import native  # noqa: E402
from vgpuctl.system.region import Region  # noqa: E402
from vgpuctl.system.structs import ffi  # noqa: E402

TAMPERED = "its usage region was tampered with"
# Shares each round walks through, (job A, job B) per step.
STEPS = [(60, 30), (20, 30), (20, 10), (60, 40), (15, 40), (60, 30)]


def call(sock: Path, op: str, **fields) -> dict:
    with Client.connect(sock) as c:
        return c.call(op, **fields)


def wait(cond, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def burn(kernel_us: int, seconds: float = 120) -> list[str]:
    return [str(native.burn_program()), "--kernel-us", str(kernel_us), "--inflight", "8",
            "--seconds", str(seconds)]


def torch_loop(seconds: float = 120) -> list[str]:
    return [sys.executable, str(HERE / "frameworks.py"), "--loop", f"{seconds:g}"]


def start_job(env: dict, sock: Path, name: str, core: int, argv: list[str]) -> tuple:
    p = subprocess.Popen([*vgpuctl_argv(), "run", "-q", "--mem", "3G", "--core", str(core),
                          "--gpu", "0", "--name", name, "--", *argv], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    job = wait(lambda: next((j for j in call(sock, "ps")["jobs"]
                             if j["name"] == name and j["pids"]
                             and (j["gated_launches"] or 0) > 0), None),
               120, f"job {name} to launch through its gate")
    return p, job["id"]


def one_round(env: dict, sock: Path, r: int, kind: str) -> list[str]:
    """One round; the verdicts found (job id: why)."""
    if kind == "torch":
        argvs = (torch_loop(), torch_loop())
    else:
        argvs = (burn(50), burn(200))
    a = start_job(env, sock, f"a{r}", STEPS[0][0], argvs[0])
    b = start_job(env, sock, f"b{r}", STEPS[0][1], argvs[1])
    jobs = (a, b)
    try:
        for k, (ca, cb) in enumerate(STEPS[1:]):
            for (_, jid), core in zip(jobs, (ca, cb), strict=True):
                subprocess.run([*vgpuctl_argv(), "set", jid, "--core", str(core)], env=env,
                               check=True, stdout=subprocess.DEVNULL)
            if k == 2:
                subprocess.run([*vgpuctl_argv(), "set", a[1], "--mem", "2G"], env=env,
                               check=True, stdout=subprocess.DEVNULL)
            time.sleep(0.7)
        found = []
        for _, jid in jobs:
            why = call(sock, "ps", job=jid)["jobs"][0]["region_error"]
            if why:
                found.append(f"job {jid}: {why}")
        return found
    finally:
        for _, jid in jobs:
            subprocess.run([*vgpuctl_argv(), "kill", jid], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for p, _ in jobs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def poke_tokens(job_dir: Path, stop: threading.Event, started: list[float]) -> None:
    """A thread of the job writing 2^62 into its bucket, in a loop."""
    f = ffi()
    off = f.offsetof("struct vgpu_usage", "dev") + f.offsetof("struct vgpu_dev_usage",
                                                              "tokens")
    full = (2**62).to_bytes(8, "little", signed=True)
    try:
        reg = Region.open(job_dir, writable_usage=True)
    except (OSError, ValueError):
        return
    try:
        started.append(time.time())
        while not stop.is_set():
            reg.poke_usage(off, full)
    finally:
        reg.close()


def log_time(line: str) -> float:
    stamp = line[:23]                # 2026-11-26 10:00:00,123
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def forged(env: dict, sock: Path, base: Path, k: int) -> float:
    p, jid = start_job(env, sock, f"forger{k}", 10, burn(1000))
    usage = base / "run" / "jobs" / jid
    stop, started = threading.Event(), []
    t = threading.Thread(target=poke_tokens, args=(usage, stop, started), daemon=True)
    log = base / "daemon.log"
    seen = len(log.read_text().splitlines())
    t.start()
    try:
        line = wait(lambda: next((ln for ln in log.read_text().splitlines()[seen:]
                                  if TAMPERED in ln and f"job {jid} " in ln), None),
                    30, "the forged tokens' verdict")
    finally:
        stop.set()
        t.join()
        p.kill()
        p.wait()
    return log_time(line) - started[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--forged", type=int, default=10)
    ap.add_argument("--cpu-burners", type=int, default=4)
    ap.add_argument("--starve", type=int, metavar="NICE", default=None,
                    help="starve the daemon: it runs at this nice value, and it, the "
                         "burners and the jobs share one CPU")
    ap.add_argument("--out", default=str(HERE / "results" / "tamper_verdicts.json"))
    args = ap.parse_args()
    try:
        import torch  # noqa: F401
        kinds = ("burn", "torch")
    except ImportError:
        kinds = ("burn",)
    base = Path(tempfile.mkdtemp(prefix="vgpu-tamper-"))
    daemon, env = start_daemon(base, bytecode_cache=False)
    sock = base / "vgpud.sock"
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(args.cpu_burners)]
    if args.starve is not None:
        os.setpriority(os.PRIO_PROCESS, daemon.pid, args.starve)
        for pid in (daemon.pid, os.getpid(), *(b.pid for b in burners)):
            os.sched_setaffinity(pid, {0})      # the jobs inherit this process's
    verdicts: list[str] = []
    by_kind: dict[str, int] = {k: 0 for k in kinds}
    latencies: list[float] = []
    t0 = time.monotonic()
    try:
        for r in range(args.rounds):
            kind = kinds[r % len(kinds)]
            found = one_round(env, sock, r, kind)
            by_kind[kind] += 1
            verdicts += found
            print(f"round {r + 1}/{args.rounds} ({kind}): "
                  f"{'; '.join(found) if found else 'no verdict'}", flush=True)
        log_verdicts = [ln for ln in (base / "daemon.log").read_text().splitlines()
                        if TAMPERED in ln]
        for k in range(args.forged):
            latencies.append(forged(env, sock, base, k))
            print(f"forged tokens {k + 1}/{args.forged}: caught after "
                  f"{latencies[-1] * 1e3:.0f} ms", flush=True)
    finally:
        for b in burners:
            b.kill()
            b.wait()
        daemon.terminate()
        daemon.wait(30)
        remove_regions(base / "run")
    res = {
        "machine": platform.node(), "cpus": os.cpu_count(),
        "cpu_burners": args.cpu_burners, "starved": args.starve, "rounds": args.rounds,
        "rounds_by_kind": by_kind,
        "verdicts": len(verdicts), "verdict_details": verdicts[:20],
        "log_verdicts_in_rounds": len(log_verdicts),
        "forged_caught_s": [round(x, 4) for x in latencies],
        "forged_caught_s_median": statistics.median(latencies) if latencies else None,
        "forged_caught_s_max": max(latencies) if latencies else None,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    print(f"honest rounds: {args.rounds} ({by_kind}), verdicts: {len(verdicts)} "
          f"(log lines: {len(log_verdicts)})")
    if latencies:
        print(f"forged tokens caught: median {res['forged_caught_s_median'] * 1e3:.0f} ms, "
              f"max {res['forged_caught_s_max'] * 1e3:.0f} ms ({len(latencies)} times)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
