"""vgpuctl demo: runs on the simulated GPU with no set-up, shows the jobs and
their report, exits 0, and leaves nothing behind (Ctrl-C included)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
from support.daemon import needs_native, vgpuctl_argv

pytestmark = needs_native


def demo_cmd(*args: str) -> list[str]:
    return [*vgpuctl_argv(), "demo", *args]


def demo_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPU_")}
    env["TMPDIR"] = str(tmp_path)     # the demo's private folder lands here
    return env


def leftovers(tmp_path: Path) -> list[str]:
    """Processes or files the demo left in its folder."""
    procs = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid != os.getpid() and any(str(tmp_path) in a for a in p.info["cmdline"] or []):
                procs.append(f"pid {p.pid}: {' '.join(p.info['cmdline'])}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return procs + [str(f) for f in tmp_path.iterdir()]


def wait_gone(tmp_path: Path, timeout: float = 15.0) -> list[str]:
    deadline = time.monotonic() + timeout
    left = leftovers(tmp_path)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = leftovers(tmp_path)
    return left


def test_demo_runs_and_reports(tmp_path):
    r = subprocess.run(demo_cmd("--seconds", "3"), env=demo_env(tmp_path), capture_output=True,
                       text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    # Progress on stderr, one line per step.
    assert "starting a private daemon on VGPU_SIM=1x16G" in r.stderr
    assert "starting 3 vgpu-burn jobs" in r.stderr
    assert "stopping the daemon" in r.stderr
    out = r.stdout
    assert "\x1b" not in out                      # no colour off a terminal
    report = out[out.index("What each job got"):].splitlines()
    header = report[1]
    assert header.split()[:2] == ["Job", "Name"]
    rows = {line.split()[1]: line for line in report[2:]}
    assert set(rows) == {"train", "serve", "etl"}
    # The summary is narrow enough for an 80-column terminal, off one too.
    assert all(len(line) <= 80 for line in report), report
    col = header.index("GPU time") + len("GPU time")
    for name, line in rows.items():
        # Each job used some GPU time (right-aligned under its header).
        cell = line[:col].split()[-1]
        assert float(cell.removesuffix("s")) > 0.05, (name, line)
    assert not wait_gone(tmp_path)


def test_demo_ctrl_c_cleans_up(tmp_path):
    err = tmp_path.parent / f"{tmp_path.name}.stderr"
    with open(err, "w") as ef:
        p = subprocess.Popen(demo_cmd("--seconds", "60"), env=demo_env(tmp_path),
                             stdout=subprocess.DEVNULL, stderr=ef, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while "jobs running" not in err.read_text() and time.monotonic() < deadline:
            assert p.poll() is None, err.read_text()
            time.sleep(0.1)
        assert "jobs running" in err.read_text()
        p.send_signal(signal.SIGINT)
        rc = p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 130, err.read_text()
    assert not wait_gone(tmp_path)
    assert "Traceback" not in err.read_text()
