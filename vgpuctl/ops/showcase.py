"""``vgpuctl demo``: the whole product in one command, on the simulated GPU.

A private world in a temporary folder: the simulator's state file, a user
daemon with its own socket, runtime and state dirs and config, and three
``vgpu-burn`` jobs started through ``vgpuctl run`` with different memory
limits, compute shares and policies. Nothing outside the folder is touched
and everything started is stopped when the demo ends, by Ctrl-C too.

This module does the work and reports through callbacks; the command
(vgpuctl/cli/commands/demo.py) does the showing.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vgpuctl.errors import DemoError, VgpuError
from vgpuctl.system import native, paths

DEFAULT_SIM = "1x16G"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class DemoJob:
    name: str
    mem: str
    core: int
    policy: str
    kernel_us: int


JOBS = (
    DemoJob("train", "4G", 30, "hard", 2000),
    DemoJob("serve", "2G", 50, "soft", 500),
    DemoJob("etl", "1G", 20, "hard", 5000),
)


def _vgpuctl() -> list[str]:
    return [sys.executable, "-c", "from vgpuctl.cli import main; main()"]


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()
                 if ln.strip()]
    except OSError:
        return "no output"
    return lines[-1] if lines else "no output"


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM,
          timeout: float = STOP_TIMEOUT_S) -> None:
    """Stop a process started in its own session, and whatever it started."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait(timeout)


class Demo:
    """One run of the demo. Use as a context manager: leaving it stops every
    process and removes the folder."""

    def __init__(self, seconds: float = 10.0, jobs: tuple[DemoJob, ...] = JOBS,
                 env: dict[str, str] | None = None, config: str = "") -> None:
        self.seconds = seconds
        self.jobs = jobs
        self.config_text = config
        self.dir = Path(tempfile.mkdtemp(prefix="vgpu-demo-"))
        base = dict(os.environ if env is None else env)
        for k in ("VGPU_REGION", "VGPU_JOB", "NOTIFY_SOCKET", "WATCHDOG_USEC",
                  "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID"):
            base.pop(k, None)
        base.setdefault("VGPU_SIM", DEFAULT_SIM)
        self.socket = self.dir / paths.SOCKET_NAME
        self.state_dir = self.dir / "state"
        self.config = self.dir / "vgpu.toml"
        base.update({
            "VGPU_SIM_STATE": str(self.dir / "sim-state"),
            "VGPU_SOCKET": str(self.socket),
            "VGPU_RUNTIME_DIR": str(self.dir / "run"),
            "VGPU_STATE_DIR": str(self.state_dir),
            "VGPU_CONFIG": str(self.config),
        })
        self.env = base
        self.daemon: subprocess.Popen[bytes] | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.exit_codes: dict[str, int] = {}
        self.started_at = time.time()

    # -- context -----------------------------------------------------------------
    def __enter__(self) -> Demo:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cleanup()

    def cleanup(self) -> None:
        """Stop every job and the daemon, remove the folder. Idempotent."""
        for p in self.procs.values():
            _stop(p)
        if self.daemon is not None:
            _stop(self.daemon)
        # A region's shared memory outlives its files: what a daemon that
        # stopped before its jobs ended left goes too.
        from vgpuctl.system.region import Region

        jobs = Path(self.env["VGPU_RUNTIME_DIR"]) / "jobs"
        if jobs.is_dir():
            for p in jobs.iterdir():
                Region.discard(p)
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- steps -------------------------------------------------------------------
    def log(self, name: str) -> Path:
        return self.dir / f"{name}.log"

    def start_daemon(self, extra_env: dict[str, str] | None = None) -> None:
        """Start the private daemon and wait until it answers. ``extra_env``
        goes to the daemon only (tests pass NOTIFY_SOCKET)."""
        self.config.write_text('# vgpuctl demo\ntick_ms = 100\nlog_level = "info"\n'
                               + self.config_text)
        self.state_dir.mkdir(mode=0o700, exist_ok=True)
        cmd = _vgpuctl() + ["daemon", "--user", "--socket", str(self.socket),
                            "--runtime-dir", self.env["VGPU_RUNTIME_DIR"],
                            "--state-dir", str(self.state_dir), "--config", str(self.config)]
        with open(self.log("daemon"), "wb") as out:
            self.daemon = subprocess.Popen(cmd, env={**self.env, **(extra_env or {})},
                                           stdin=subprocess.DEVNULL,
                                           stdout=out, stderr=out, start_new_session=True,
                                           cwd=self.dir)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                self.ps()
                return
            except VgpuError:
                pass
            if self.daemon.poll() is not None:
                raise DemoError(f"the daemon did not start: {_last_line(self.log('daemon'))}")
            time.sleep(0.05)
        raise DemoError(f"the daemon did not answer within {START_TIMEOUT_S:.0f} s "
                        f"({_last_line(self.log('daemon'))})")

    def start_jobs(self) -> None:
        burn = str(native.burn_program())
        for j in self.jobs:
            cmd = _vgpuctl() + ["run", "--mem", j.mem, "--core", str(j.core), "--policy",
                                j.policy, "--name", j.name, "--", burn, "--kernel-us",
                                str(j.kernel_us), "--seconds", f"{self.seconds:g}"]
            env = dict(self.env, VGPU_SIM_TAG=j.name)
            with open(self.log(j.name), "wb") as out:
                self.procs[j.name] = subprocess.Popen(
                    cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                    start_new_session=True, cwd=self.dir)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            running = {j["name"] for j in self.ps().get("jobs", [])
                       if j.get("state") == "running"}
            if all(j.name in running for j in self.jobs):
                return
            for name, p in self.procs.items():
                if p.poll() is not None and name not in running:
                    raise DemoError(f"job {name} did not start: {_last_line(self.log(name))}")
            time.sleep(0.05)
        raise DemoError(f"the jobs did not start within {START_TIMEOUT_S:.0f} s")

    def ps(self) -> dict[str, Any]:
        """The daemon's view of the node (the ``ps`` reply)."""
        from vgpuctl.client import connection as client

        try:
            with client.Client.connect(self.socket, timeout=10.0) as cl:
                return cl.call("ps")
        except OSError as e:
            raise DemoError(f"the daemon on {self.socket}: {e.strerror or e}") from None

    def jobs_done(self) -> bool:
        return all(p.poll() is not None for p in self.procs.values())

    def watch(self, show: Callable[[dict[str, Any]], None], every: float = 0.5) -> None:
        """Call ``show`` with the daemon's view every ``every`` seconds until
        the jobs end (at most the demo's length plus a margin)."""
        deadline = time.monotonic() + self.seconds + START_TIMEOUT_S
        while True:
            show(self.ps())
            if self.jobs_done() or time.monotonic() >= deadline:
                break
            time.sleep(every)

    def finish_jobs(self) -> dict[str, int]:
        """Wait for the jobs to end (stopping any that overrun), and for the
        daemon to see them end; returns each job's exit code."""
        deadline = time.monotonic() + START_TIMEOUT_S
        for name, p in self.procs.items():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _stop(p)
            self.exit_codes[name] = p.returncode
        while time.monotonic() < deadline:
            if not self.ps().get("jobs"):
                break
            time.sleep(0.1)
        return dict(self.exit_codes)

    def stop_daemon(self) -> None:
        """SIGTERM, as systemd stops it: it writes its last accounting."""
        if self.daemon is not None:
            _stop(self.daemon)

    def report(self) -> Any:
        """The usage report of the demo's jobs, from the daemon's database."""
        from vgpuctl.store import reports

        return reports.build(self.state_dir / paths.DB_NAME, "job", self.started_at - 1,
                            time.time() + 1)
