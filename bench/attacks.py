"""What a co-tenant keeps when another user walks past the hook (issue 20).

    python bench/attacks.py [--seconds 20] [--rounds 5] [--output FILE]

Each compute scenario runs on a fresh private daemon over one simulated
16 GiB GPU with on_violation = "kill" (or --on-violation): root's
neighbour, a hooked vgpu-burn at --core 60 (1 ms kernels) for --seconds,
and beside it, from
the neighbour's start, one attack by another user (nobody, uid 65534), its
processes without the hook:

  baseline      no attack
  eight_small   eight --core 1 jobs, each a burner busy 10.5 % of the time
  eight_unpromised
                as eight_small, the jobs with no --core (issue 30)
  duty_cycle    a --core 10 job burning 700 ms on, 700 ms off
  chain         a --core 10 job whose shell starts 0.4 s burners one after
                another
  respawn       a --core 10 job whose shell starts a burner again whenever
                one dies
  chain_50ms    as chain, each burner 50 ms (shorter than the watch's tick:
                some are gone before NVML's process list shows them)

Figures per scenario: the neighbour's share of the GPU over its whole run
(its kernel time on the simulated GPU's own record, VGPU_SIM_TAG, over its
wall time: target within 3 points of 60 %); for the attack, the time from
its job's start to its first violation and to its job's end (the daemon's
clock: target 3 s), and the GPU time it got.

The memory scenario runs in the default config (on_violation = "protect"):
a 4 GiB job whose process (no hook) allocates 12 GiB, beside an 8 GiB job
that then asks for 7.5 GiB and tries again every 20 ms: the time from the
bypass's allocation returning to the co-tenant's succeeding (target 1 s),
--rounds times.

Writes bench/results/attacks.json. Timings are figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from run_overhead import launch_daemon, remove_regions, vgpuctl_argv  # noqa: E402

from vgpuctl.client.connection import Client  # noqa: E402
from vgpuctl.system import native  # noqa: E402

NOBODY = 65534
G = 1 << 30


def start_daemon(base: Path, config: str) -> tuple[subprocess.Popen, dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPU_")}
    env.pop("LD_PRELOAD", None)
    proc = launch_daemon(base, env, config, "1x16G")
    os.chmod(base / "sim-state", 0o666)       # nobody's processes use it too
    return proc, env


def call(sock: Path, op: str, **fields) -> dict:
    with Client.connect(sock) as c:
        return c.call(op, **fields)


def nobody_job(sock: Path, argv: list[str], env: dict[str, str], mem: int, core: int | None,
               tag: str) -> str:
    """A job of nobody's whose command runs as nobody without the hook (as
    tests/support/hostile.py's start_job_as_nobody); its id."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 1
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            ask = {"core": core} if core is not None else {}
            reply = call(sock, "run", command=argv, cwd="/", mem=mem, **ask)
            job_env = {**env, **reply["env"], "VGPU_SIM_TAG": tag, "PATH": "/usr/bin:/bin"}
            lib = reply["prepend"].get("LD_LIBRARY_PATH")
            if lib:
                job_env["LD_LIBRARY_PATH"] = lib
            child = os.fork()
            if child == 0:
                null = os.open("/dev/null", os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.closerange(3, 65536)
                os.execvpe(argv[0], argv, job_env)
            call(sock, "started", job=reply["job"]["id"], pid=child)
            os.write(w, reply["job"]["id"].encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    got = os.read(r, 64).decode()
    os.close(r)
    os.waitpid(pid, 0)
    if not got:
        raise SystemExit("nobody's job did not start")
    return got


def tag_busy_s(env: dict[str, str], tag: str) -> float:
    out = subprocess.run([*vgpuctl_argv(), "sim", "stats", "--json"], env=env,
                         capture_output=True, text=True, check=True).stdout
    for t in json.loads(out)["tags"]:
        if t["name"] == tag:
            return sum(d.get("busy_ns", 0) for d in t["devices"]) / 1e9
    return 0.0


def burn() -> str:
    return str(native.burn_program())


ATTACKS = {
    "baseline": [],
    "eight_small": [([burn(), "--kernel-us", "500", "--seconds", "600", "--duty", "10.5"],
                     512 << 20, 1)] * 8,
    "duty_cycle": [([burn(), "--kernel-us", "1000", "--seconds", "600", "--on-ms", "700",
                     "--off-ms", "700"], G, 10)],
    "chain": [(["sh", "-c", f"while :; do {burn()} --kernel-us 1000 --seconds 0.4; done"],
               G, 10)],
    "respawn": [(["sh", "-c", f"while :; do {burn()} --kernel-us 1000 --seconds 600; done"],
                 G, 10)],
    # issue 30: jobs with no --core (a budget of 100 % before)
    "eight_unpromised": [([burn(), "--kernel-us", "500", "--seconds", "600", "--duty", "10.5"],
                          512 << 20, None)] * 8,
    # beyond the list: processes shorter than the watch's tick
    "chain_50ms": [(["sh", "-c", f"while :; do {burn()} --kernel-us 1000 --seconds 0.05; done"],
                    G, 10)],
}


def compute_scenario(name: str, seconds: float, on_violation: str) -> dict:
    base = Path(tempfile.mkdtemp(prefix="vgpu-attack-"))
    os.chmod(base, 0o755)
    proc, env = start_daemon(base, f'on_violation = "{on_violation}"\ncooldown_s = 0\n')
    sock = base / "vgpud.sock"
    try:
        nenv = {**env, "VGPU_SIM_TAG": "neighbour"}
        nb = subprocess.Popen([*vgpuctl_argv(), "run", "--mem", "2G", "--core", "60", "--",
                               burn(), "--kernel-us", "1000", "--seconds", str(seconds)],
                              env=nenv, stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while not any(j["pids"] for j in call(sock, "ps")["jobs"]):
            if time.monotonic() > deadline:
                raise SystemExit("the neighbour did not start")
            time.sleep(0.01)
        ids = [nobody_job(sock, argv, env, mem, core, "attack")
               for argv, mem, core in ATTACKS[name]]
        out, _ = nb.communicate(timeout=seconds + 60)
        report = json.loads(out.strip().splitlines()[-1])
        share = tag_busy_s(env, "neighbour") / report["seconds"]
        jobs = {j["id"]: j for j in call(sock, "ps", all=True)["jobs"]}
        caught, stopped = [], []
        for jid in ids:
            j = jobs[jid]
            if j["violations"] and j["started"]:
                caught.append(min(v["time"] for v in j["violations"]) - j["started"])
            if j["state"] == "ended" and j["started"]:
                stopped.append(j["ended"] - j["started"])
        return {"neighbour_share_pct": round(100 * share, 2),
                "neighbour_error_points": round(100 * share - 60, 2),
                "attack_jobs": len(ids),
                "attack_gpu_s": round(tag_busy_s(env, "attack"), 3),
                "first_violation_s": round(max(caught), 3) if caught else None,
                "stopped_s": round(max(stopped), 3) if len(stopped) == len(ids) and ids
                else None,
                "stopped_jobs": len(stopped)}
    finally:
        for j in call(sock, "ps")["jobs"]:
            for p in j["pids"]:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        remove_regions(base / "run")
        shutil.rmtree(base, ignore_errors=True)


HOLD = """
import os, sys, time
from cuda.bindings import driver as cu
cu.cuInit(0)
ctx = cu.cuDevicePrimaryCtxRetain(0)[1]
cu.cuCtxSetCurrent(ctx)
r = cu.cuMemAlloc(12 << 30)
print(time.time(), r[0].name, flush=True)
sys.stdin.readline()
"""

COTENANT = """
import sys, time
from cuda.bindings import driver as cu
cu.cuInit(0)
ctx = cu.cuDevicePrimaryCtxRetain(0)[1]
cu.cuCtxSetCurrent(ctx)
print("ready", flush=True)
sys.stdin.readline()
tries = 0
while True:
    r = cu.cuMemAlloc(int(7.5 * (1 << 30)))
    tries += 1
    if r[0] == cu.CUresult.CUDA_SUCCESS:
        print(time.time(), tries, flush=True)
        break
    time.sleep(0.02)
sys.stdin.readline()
"""


def memory_round() -> float:
    base = Path(tempfile.mkdtemp(prefix="vgpu-attack-"))
    os.chmod(base, 0o755)
    proc, env = start_daemon(base, "")       # the default configuration
    procs = []
    try:
        co = subprocess.Popen([*vgpuctl_argv(), "run", "--mem", "8G", "--", sys.executable,
                               "-c", COTENANT], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
        procs.append(co)
        assert co.stdout is not None and co.stdin is not None
        if co.stdout.readline().strip() != "ready":
            raise SystemExit("the co-tenant did not start")
        hog = subprocess.Popen([*vgpuctl_argv(), "run", "--mem", "4G", "--", "env", "-u",
                                "LD_PRELOAD", sys.executable, "-c", HOLD], env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(hog)
        assert hog.stdout is not None
        t_hog, result = hog.stdout.readline().split()
        if result != "CUDA_SUCCESS":
            raise SystemExit(f"the bypass's allocation failed: {result}")
        co.stdin.write("\n")
        co.stdin.flush()
        t_ok = float(co.stdout.readline().split()[0])
        return t_ok - float(t_hog)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        remove_regions(base / "run")
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", nargs="*", default=None, help="scenarios to run")
    ap.add_argument("--on-violation", default="kill", choices=("kill", "protect", "report"),
                    help="the daemon's on_violation for the compute scenarios")
    ap.add_argument("--output", default=str(HERE / "results" / "attacks.json"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the attacks run as nobody")
    t0 = time.monotonic()
    load0 = os.getloadavg()
    compute = {}
    for name in ATTACKS:
        if args.only is None or name in args.only:
            compute[name] = compute_scenario(name, args.seconds, args.on_violation)
            print(name, compute[name], flush=True)
    mem = [memory_round() for _ in range(args.rounds)] \
        if args.only is None or "memory" in args.only else []
    result = {
        "benchmark": "attacks", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": "simulated GPU (VGPU_SIM=1x16G)",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "seconds": args.seconds, "on_violation": args.on_violation,
        "elapsed_s": round(time.monotonic() - t0, 1),
        "loadavg_before": [round(x, 2) for x in load0],
        "targets": {"neighbour_error_points": 3.0, "stopped_s": 3.0,
                    "cotenant_alloc_s": 1.0},
        "compute": compute,
        "memory": {"rounds": len(mem),
                   "cotenant_alloc_s": {"median": round(statistics.median(mem), 3),
                                        "max": round(max(mem), 3)} if mem else None},
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'scenario':<14}{'neighbour %':>12}{'violation s':>12}{'stopped s':>11}"
          f"{'attack GPU-s':>13}")
    for name, r in compute.items():
        print(f"{name:<14}{r['neighbour_share_pct']:>12.2f}"
              f"{r['first_violation_s'] if r['first_violation_s'] is not None else '-':>12}"
              f"{r['stopped_s'] if r['stopped_s'] is not None else '-':>11}"
              f"{r['attack_gpu_s']:>13.3f}")
    if mem:
        print(f"co-tenant's 7.5 GiB after a 12 GiB bypass: median {statistics.median(mem):.3f}"
              f" s, max {max(mem):.3f} s")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
