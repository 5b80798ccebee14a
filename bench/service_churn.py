"""The daemon under a hostile user's connections: 1,100 idle connections at
1,024 descriptors, then 30 s of connect/close churn.

    python bench/service_churn.py [--idle 1100] [--churn-s 30] [--churners 2]
                                  [--out bench/results/service_churn.json]

Starts a real `vgpuctl daemon` (simulated GPU, its RLIMIT_NOFILE lowered to
1,024) in a temporary dir. The attacker runs as nobody (uid 65534) through
the system's python3 when this runs as root (the daemon's caps are per uid;
the operator is root), else as this user. For each phase it times the
operator's requests: `ps` over the socket (connect to reply) and a
`vgpuctl ps` process, each every 0.25 s, and one `vgpuctl run -- true`, and
records whether run went through the daemon (or started a private one),
and how large the daemon's log grew. Target: every `ps` within 2 s, run
through the daemon.

Prints a short table and writes the figures to --out. Timings are figures,
not pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from support.hostile import CHURN, HOLD, NOBODY  # noqa: E402

sys.path.insert(0, str(HERE))
from run_overhead import remove_regions  # noqa: E402


def vgpuctl_argv() -> list[str]:
    exe = Path(sys.executable).parent / "vgpuctl"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "vgpuctl"]


def attacker(code: str, *args: str) -> subprocess.Popen[str]:
    py = shutil.which("python3", path="/usr/bin:/bin") or sys.executable

    def drop() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (8192, 8192))
        if os.geteuid() == 0:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
    return subprocess.Popen([py, "-c", code, *args], preexec_fn=drop, text=True, cwd="/",
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def socket_ps(path: Path, timeout: float = 10.0) -> float | None:
    """Seconds from connect to the ps reply; None when it failed."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            s.connect(str(path))
            s.sendall(b'{"v":1,"op":"ps"}\n')
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(1 << 16)
                if not chunk:
                    return None
                buf += chunk
            return time.monotonic() - t0 if b'"ok":true' in buf else None
        except BlockingIOError:        # a full backlog: as the client does, retry
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)
        except OSError:
            return None
        finally:
            s.close()


def cli_ps(env: dict[str, str]) -> tuple[float, bool]:
    t0 = time.monotonic()
    try:
        r = subprocess.run([*vgpuctl_argv(), "ps", "--json"], env=env, capture_output=True,
                           timeout=30)
        ok = r.returncode == 0
    except subprocess.TimeoutExpired:
        ok = False
    return time.monotonic() - t0, ok


def run_job(env: dict[str, str]) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        r = subprocess.run([*vgpuctl_argv(), "run", "--mem", "256M", "--", "true"], env=env,
                           capture_output=True, text=True, timeout=120)
        rc, err = r.returncode, r.stderr
    except subprocess.TimeoutExpired:
        rc, err = None, "timed out"
    return {"rc": rc, "s": round(time.monotonic() - t0, 3),
            "private_daemon": "user daemon" in err, "stderr": err.strip()[-300:]}


def sample(sock: Path, env: dict[str, str], seconds: float) -> dict[str, Any]:
    sock_t: list[float] = []
    cli_t: list[float] = []
    fails = {"socket": 0, "cli": 0}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = socket_ps(sock)
        if t is None:
            fails["socket"] += 1
        else:
            sock_t.append(t)
        t, ok = cli_ps(env)
        cli_t.append(t)
        fails["cli"] += 0 if ok else 1
        time.sleep(0.25)

    def stats(xs: list[float]) -> dict[str, float | int | None]:
        return {"n": len(xs), "median_s": round(statistics.median(xs), 3) if xs else None,
                "max_s": round(max(xs), 3) if xs else None}
    return {"socket_ps": stats(sock_t), "cli_ps": stats(cli_t), "failed": fails}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle", type=int, default=1100)
    ap.add_argument("--churn-s", type=float, default=30.0)
    ap.add_argument("--churners", type=int, default=2)
    ap.add_argument("--out", default=str(HERE / "results" / "service_churn.json"))
    a = ap.parse_args()

    base = Path(tempfile.mkdtemp(prefix="vgpu-bench-", dir="/tmp"))
    os.chmod(base, 0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPU_")}
    env.update({"VGPU_SIM": "2x16G", "VGPU_SIM_STATE": str(base / "sim"),
                "VGPU_SOCKET": str(base / "vgpud.sock"), "VGPU_RUNTIME_DIR": str(base / "run"),
                "VGPU_STATE_DIR": str(base / "state"), "VGPU_CONFIG": str(base / "vgpu.toml"),
                "VGPU_DAEMON_WAIT": "20"})
    (base / "vgpu.toml").write_text("")
    sock = base / "vgpud.sock"
    log = base / "daemon.log"
    with open(log, "ab") as f:
        daemon = subprocess.Popen(
            [*vgpuctl_argv(), "daemon"], env=env, stdin=subprocess.DEVNULL, stdout=f,
            stderr=f, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                                            (1024, 1024)))
    out: dict[str, Any] = {"machine": platform.machine(), "cpus": os.cpu_count(),
                           "python": platform.python_version(),
                           "attacker_uid": NOBODY if os.geteuid() == 0 else os.getuid()}
    try:
        deadline = time.monotonic() + 20
        while socket_ps(sock, 1.0) is None:
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit(f"the daemon did not start: {log.read_text()[-500:]}")
            time.sleep(0.05)

        log0 = log.stat().st_size
        hog = attacker(HOLD, str(sock), str(a.idle))
        held = json.loads(hog.stdout.readline())["open"]
        idle = sample(sock, env, 5.0)
        idle["run"] = run_job(env)
        hog.stdin.close()
        hog.wait(60)
        idle.update(connections_kept=held, log_bytes=log.stat().st_size - log0)
        out["idle"] = idle

        log0 = log.stat().st_size
        churn = [attacker(CHURN, str(sock), str(a.churn_s)) for _ in range(a.churners)]
        res = sample(sock, env, max(1.0, a.churn_s - 3))
        res["run"] = run_job(env)
        res["churn_connects"] = sum(int(p.communicate(timeout=a.churn_s + 60)[0] or 0)
                                    for p in churn)
        res["seconds"] = a.churn_s
        res["log_bytes"] = log.stat().st_size - log0
        out["churn"] = res
        out["daemon_alive"] = daemon.poll() is None
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(15)
            except subprocess.TimeoutExpired:
                daemon.kill()
        # A private daemon run may have started (on the daemon's socket path).
        remove_regions(base / "run")
        shutil.rmtree(base, ignore_errors=True)

    print(f"{'phase':<8} {'socket ps med/max s':>20} {'cli ps med/max s':>18} "
          f"{'failed s/c':>10} {'run':>12} {'log bytes':>10}")
    for ph in ("idle", "churn"):
        r = out[ph]
        s, c, f = r["socket_ps"], r["cli_ps"], r["failed"]
        run = "private!" if r["run"]["private_daemon"] else f"rc {r['run']['rc']}"
        print(f"{ph:<8} {s['median_s']!s:>9}/{s['max_s']!s:<10} {c['median_s']!s:>8}/"
              f"{c['max_s']!s:<9} {f['socket']:>4}/{f['cli']:<5} {run:>12} "
              f"{r['log_bytes']:>10}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
