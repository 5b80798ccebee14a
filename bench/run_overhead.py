"""What `vgpuctl run` adds to a command, and how long `vgpuctl ps --json`
takes with 200 jobs running.

    python bench/run_overhead.py [--pairs 40] [--jobs 200] [--socket PATH]

Without --socket it starts a private daemon over the simulated GPU
(VGPU_SIM=2x16G) in a temporary directory and stops it at the end.

1. `vgpuctl run --mem 1G --core 100 -- true` against plain `true`, run
   alternately (so drift hits both alike), median of each and of the
   per-pair differences. Target: at most 100 ms added.
2. 200 jobs registered the cheap way (one process sends `run`, forks
   `sleep 600`, sends `started`: what `vgpuctl run` does, without 200
   Python interpreters), then `vgpuctl ps --json` timed. Target: < 150 ms.

Python's bytecode cache is on for the timed commands, as in any pip
install (PYTHONDONTWRITEBYTECODE is dropped; the cache goes to a temporary
PYTHONPYCACHEPREFIX, not into the source tree); --no-bytecode-cache keeps
the caller's setting.

Prints a short table and writes bench/results/run_overhead.json. Timings are
figures, not pass/fail.
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

from vgpuctl.client.connection import Client  # noqa: E402


def vgpuctl_argv() -> list[str]:
    exe = Path(sys.executable).parent / "vgpuctl"
    return [str(exe)] if exe.exists() else [sys.executable, "-c",
                                            "from vgpuctl.cli import main; main()"]


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{argv} failed ({r.returncode}): {r.stderr.decode().strip()}")
    return dt


def remove_regions(runtime: Path) -> None:
    """Remove the job regions a stopped daemon left in its runtime dir: their
    shared memory outlives every process otherwise."""
    from vgpuctl.system.region import Region

    jobs = runtime / "jobs"
    if jobs.is_dir():
        for p in jobs.iterdir():
            Region.discard(p)


def launch_daemon(base: Path, env: dict[str, str], config: str,
                  gpus: str) -> subprocess.Popen:
    """`vgpuctl daemon` on a simulated GPU of gpus, its socket, runtime and
    state dir, the simulator's state and its config file (config) in base;
    env gains those settings, for its clients. Returns once its socket
    answers; exits the benchmark if it fails to start."""
    env.update({"VGPU_SIM": gpus, "VGPU_SIM_STATE": str(base / "sim-state"),
                "VGPU_SOCKET": str(base / "vgpud.sock"), "VGPU_RUNTIME_DIR": str(base / "run"),
                "VGPU_STATE_DIR": str(base / "state"), "VGPU_CONFIG": str(base / "vgpu.toml")})
    (base / "vgpu.toml").write_text(config)
    log = open(base / "daemon.log", "ab")
    proc = subprocess.Popen([*vgpuctl_argv(), "daemon"], env=env, stdout=log, stderr=log,
                            stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            Client.connect(base / "vgpud.sock").close()
            return proc
        except OSError:
            if proc.poll() is not None:
                raise SystemExit("daemon failed:\n" + (base / "daemon.log").read_text()) from None
            time.sleep(0.05)
    raise SystemExit("daemon did not start")


def start_daemon(base: Path, bytecode_cache: bool) -> tuple[subprocess.Popen, dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPU_")}
    if bytecode_cache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(base / "pycache")
    return launch_daemon(base, env, "", "2x16G"), env


def bench_run(env: dict[str, str], pairs: int) -> dict[str, float]:
    true = shutil.which("true") or "/bin/true"
    run = [*vgpuctl_argv(), "run", "--mem", "1G", "--core", "100", "--", true]
    for _ in range(3):                      # warm caches (page cache, imports)
        timed(run, env)
        timed([true], env)
    plain, wrapped, diffs, python = [], [], [], []
    for _ in range(pairs):
        a = timed([true], env)
        b = timed(run, env)
        plain.append(a)
        wrapped.append(b)
        diffs.append(b - a)
        # The floor: any Python command pays this before its first import.
        python.append(timed([sys.executable, "-c", "pass"], env))
    return {"true_ms": 1e3 * statistics.median(plain),
            "python_startup_ms": 1e3 * statistics.median(python),
            "run_ms": 1e3 * statistics.median(wrapped),
            "added_ms": 1e3 * statistics.median(diffs),
            "added_ms_p90": 1e3 * sorted(diffs)[int(0.9 * (len(diffs) - 1))]}


def bench_ps(env: dict[str, str], sock: Path, jobs: int, reps: int) -> dict[str, float]:
    cl = Client.connect(sock)
    started: list[tuple[str, subprocess.Popen]] = []
    try:
        for _ in range(jobs):
            r = cl.call("run", command=["sleep", "600"], cwd="/", mem=16 << 20)
            jid = r["job"]["id"]
            from vgpuctl.client.launch import job_env
            p = subprocess.Popen(["sleep", "600"], env=job_env(env, r["env"], r["prepend"]))
            cl.call("started", job=jid, pid=p.pid)
            started.append((jid, p))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:   # until the daemon has tracked them all
            listed = cl.call("ps")["jobs"]
            if len(listed) == jobs and all(j["pids"] for j in listed):
                break
            time.sleep(0.1)
        ps = [*vgpuctl_argv(), "ps", "--json"]
        timed(ps, env)
        times = [timed(ps, env) for _ in range(reps)]
        out = subprocess.run(ps, env=env, capture_output=True, text=True)
        n = len(json.loads(out.stdout)["jobs"])
        return {"ps_json_ms": 1e3 * statistics.median(times), "ps_jobs_listed": n,
                "ps_reply_bytes": len(out.stdout)}
    finally:
        for _, p in started:
            p.kill()
        for jid, p in started:
            p.wait()
            try:
                cl.call("exited", job=jid, signal=9)
            except Exception:
                pass
        cl.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--ps-reps", type=int, default=20)
    ap.add_argument("--socket", help="use this running daemon instead of a private one")
    ap.add_argument("--no-bytecode-cache", action="store_true",
                    help="keep PYTHONDONTWRITEBYTECODE as it is")
    ap.add_argument("--output", default=str(HERE / "results" / "run_overhead.json"))
    args = ap.parse_args()
    proc = None
    cache = not args.no_bytecode_cache
    base = Path(tempfile.mkdtemp(prefix="vgpu-bench-"))
    if args.socket:
        env = {**os.environ, "VGPU_SOCKET": args.socket}
        if cache:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(base / "pycache")
        sock = Path(args.socket)
    else:
        proc, env = start_daemon(base, cache)
        sock = base / "vgpud.sock"
    try:
        res = bench_run(env, args.pairs)
        res.update(bench_ps(env, sock, args.jobs, args.ps_reps))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
        remove_regions(base / "run")
        shutil.rmtree(base, ignore_errors=True)
    result = {
        "benchmark": "run_overhead", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": "simulated GPU (VGPU_SIM=2x16G)" if not args.socket else "daemon at "
        + args.socket,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "pairs": args.pairs, "jobs": args.jobs, "ps_reps": args.ps_reps,
        "bytecode_cache": cache,
        "targets": {"added_ms": 100, "ps_json_ms": 150},
        **{k: round(v, 2) if isinstance(v, float) else v for k, v in res.items()},
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'measure':<34}{'median':>10}{'target':>10}")
    print(f"{'true':<34}{result['true_ms']:>8.1f}ms")
    print(f"{'vgpuctl run --mem 1G -- true':<34}{result['run_ms']:>8.1f}ms")
    print(f"{'(python -c pass)':<34}{result['python_startup_ms']:>8.1f}ms")
    print(f"{'added by vgpuctl run':<34}{result['added_ms']:>8.1f}ms{'<= 100':>10}")
    print(f"{f'ps --json, {args.jobs} jobs':<34}{result['ps_json_ms']:>8.1f}ms{'< 150':>10}")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
