"""`vgpuctl report --since 24h` on a database holding 200,000 old jobs,
before and after the daemon's retention runs.

    python bench/report_retention.py [--old 200000] [--recent 20] [--runs 5]

Builds a state directory whose vgpu.db holds --old jobs that ended 200 days
ago (each with a usage row) and --recent jobs of the last day, times
`vgpuctl report --since 24h --format csv` (median of --runs, a fresh
process each, as cron runs it), then starts a real `vgpuctl daemon` on that
state directory (simulated GPU, retention_days = 90), waits for its
retention to finish (the log line), stops it and times the report again.
Target: under 0.2 s after retention.

Prints a short table and writes bench/results/report_retention.json.
Timings are figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from vgpuctl.store.database import Store  # noqa: E402
from vgpuctl.store.usage import create_schema  # noqa: E402

GPU = "GPU-00000000-0000-0000-0000-000000000000"
DAY = 86400.0


def vgpuctl_argv() -> list[str]:
    exe = Path(sys.executable).parent / "vgpuctl"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "vgpuctl"]


def fill(db: Path, old: int, recent: int, now: float) -> None:
    Store.open(db).close()                      # the daemon's schema
    conn = sqlite3.connect(str(db))
    create_schema(conn)
    cmd = json.dumps(["python", "train.py", "--epochs", "10"])
    gpus = json.dumps([{"index": 0, "uuid": GPU}])

    def rows(n: int, end: float):
        for i in range(n):
            t = end - i % 3600
            yield (f"job{i}", os.getuid(), "alice", cmd, "/", gpus, 1 << 30, 50, "hard",
                   "ended", t - 600, t - 600, t, 0)

    with conn:
        for n, end in ((old, now - 200 * DAY), (recent, now - 3600)):
            conn.executemany(
                "INSERT INTO jobs (name, uid, user, command, cwd, gpus, mem_limit, core_share,"
                " policy, state, created, started, ended, exit_code)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows(n, end))
        conn.execute(
            "INSERT INTO usage (job_id, gpu_uuid, t0, t1, gpu_seconds, mem_gib_hours,"
            " peak_mem_bytes) SELECT id, ?, started, ended, 300.0, 0.1, 1073741824 FROM jobs",
            (GPU,))
    conn.close()


def time_report(state: Path, env: dict[str, str], runs: int) -> tuple[float, int]:
    argv = [*vgpuctl_argv(), "report", "--since", "24h", "--format", "csv",
            "--state-dir", str(state)]
    times = []
    lines = 0
    for _ in range(runs):
        t0 = time.perf_counter()
        r = subprocess.run(argv, env=env, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if r.returncode != 0:
            raise SystemExit(f"report failed ({r.returncode}): {r.stderr.strip()}")
        lines = len(r.stdout.splitlines()) - 1
    return statistics.median(times), lines


def run_retention(base: Path, state: Path, env: dict[str, str]) -> float:
    """Start a daemon on the state dir, wait for its retention, stop it;
    returns the seconds retention took by the log."""
    (base / "vgpu.toml").write_text("retention_days = 90\n")
    denv = {**env, "VGPU_SIM": "1x16G", "VGPU_SIM_STATE": str(base / "sim-state"),
            "VGPU_RUNTIME_DIR": str(base / "run"), "VGPU_STATE_DIR": str(state),
            "VGPU_CONFIG": str(base / "vgpu.toml")}
    log = base / "daemon.err"      # a daemon started by hand logs to stderr
    t0 = time.perf_counter()
    err = open(log, "w")
    proc = subprocess.Popen([*vgpuctl_argv(), "daemon", "--user"], env=denv,
                            stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 300
        while "retention: removed" not in (log.read_text() if log.exists() else ""):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the daemon did not finish retention:\n{log.read_text()}")
            time.sleep(0.05)   # polling the log file with a deadline
        took = time.perf_counter() - t0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        err.close()
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", type=int, default=200_000)
    ap.add_argument("--recent", type=int, default=20)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "report_retention.json")
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPU_")}
    with tempfile.TemporaryDirectory(prefix="vgpu-bench-") as tmp:
        base = Path(tmp)
        state = base / "state"
        now = time.time()
        fill(state / "vgpu.db", args.old, args.recent, now)
        size_before = (state / "vgpu.db").stat().st_size
        before, rows_before = time_report(state, env, args.runs)
        took = run_retention(base, state, env)
        after, rows_after = time_report(state, env, args.runs)
        with sqlite3.connect(str(state / "vgpu.db")) as c:
            left = c.execute("SELECT count(*) FROM jobs").fetchone()[0]
    result = {
        "old_jobs": args.old, "recent_jobs": args.recent, "runs": args.runs,
        "report_s_before_retention": round(before, 4), "rows_before": rows_before,
        "daemon_start_to_retention_done_s": round(took, 3),
        "jobs_left": left, "db_bytes_before": size_before,
        "report_s_after_retention": round(after, 4), "rows_after": rows_after,
        "target_s": 0.2, "machine": platform.machine(),
        "python": platform.python_version(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'report --since 24h':<40} {'median s':>9} {'rows':>5}")
    print(f"{f'{args.old} old jobs, before retention':<40} {before:>9.3f} {rows_before:>5}")
    print(f"{'after the daemon retention':<40} {after:>9.3f} {rows_after:>5}")
    print(f"daemon start to retention done: {took:.2f} s; jobs left: {left}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
