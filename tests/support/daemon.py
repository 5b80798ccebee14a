"""A real `vgpuctl daemon` on the simulated GPU, for end-to-end tests.

The `daemon` fixture (exported through conftest.py) starts one on a private
socket, runtime and state dir (VGPU_SIM=2x16G, its own VGPU_SIM_STATE), waits
for its socket with a deadline, and kills it at teardown along with every job
it still knows. The base dir is world-traversable (0755) so that a client run
as another uid can reach the socket.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from vgpuctl.client.connection import Client
from vgpuctl.system import native

START_TIMEOUT_S = 20.0


# The start of a job's program on the driver API (after its imports): `cu`,
# and ck(r), a call's results past its error code, or an exit on an error.
CUDA_CK = """
from cuda.bindings import driver as cu
def ck(r):
    if r[0] != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"cuda error {r[0]}")
    return r[1:]
"""


def native_built() -> bool:
    """Whether the hook, the simulated GPU and vgpu-burn are all built."""
    try:
        native.hook_library()
        native.sim_libdir()
        native.burn_program()
    except Exception:
        return False
    return True


# Marks a test (or, as pytestmark, a module) that runs jobs on the simulated GPU.
needs_native = pytest.mark.skipif(not native_built(), reason="native parts not built")


def ask(sup: Any, peer: Any, line: bytes) -> dict[str, Any]:
    """A supervisor's reply to one request line, by the path the server's
    requests take (Supervisor.reply), on an event loop of its own."""
    return asyncio.run(sup.reply(peer, line))


def wait_for(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll cond until it returns something true; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def kill_and_reap(p: subprocess.Popen[Any]) -> None:
    """Kill p if it still runs, and wait for it: a test's last word on a child."""
    if p.poll() is None:
        p.kill()
        p.wait()


def read_line(stream: Any, timeout: float = 30.0) -> str:
    """One line from a child's pipe, or fail the test after timeout seconds
    (a hung job must not hang the test run)."""
    import threading

    got: list[str] = []
    t = threading.Thread(target=lambda: got.append(stream.readline()), daemon=True)
    t.start()
    t.join(timeout)
    if not got:
        raise AssertionError(f"no line from the job within {timeout} s")
    return got[0]


def vgpuctl_argv() -> list[str]:
    exe = Path(sys.executable).parent / "vgpuctl"
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-c", "from vgpuctl.cli import main; main()"]


class Daemon:
    def __init__(self, base: Path, gpus: str = "2x16G", config: str = "") -> None:
        self.base = base
        self.socket = base / "vgpud.sock"
        self.runtime = base / "run"
        self.state = base / "state"
        self.config = base / "vgpu.toml"
        self.config.write_text(config)
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("VGPU_") and k not in ("LD_PRELOAD",)}
        self.env.update({
            "VGPU_SIM": gpus, "VGPU_SIM_STATE": str(base / "sim-state"),
            "VGPU_SOCKET": str(self.socket), "VGPU_RUNTIME_DIR": str(self.runtime),
            "VGPU_STATE_DIR": str(self.state), "VGPU_CONFIG": str(self.config),
            "PYTHONUNBUFFERED": "1",
        })
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = base / "daemon.log"

    # -- the daemon process ------------------------------------------------------
    def start(self, *args: str, preexec_fn: Callable[[], Any] | None = None) -> Daemon:
        """Start `vgpuctl daemon ARGS` and wait for its socket. preexec_fn
        runs in the daemon's process before it starts (to lower a limit)."""
        log = open(self.log, "ab")
        self.proc = subprocess.Popen([*vgpuctl_argv(), "daemon", *args], env=self.env,
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     preexec_fn=preexec_fn)
        log.close()

        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}:\n"
                                     + self.log.read_text())
            try:
                Client.connect(self.socket, timeout=2).close()
                return True
            except OSError:
                return False
        wait_for(up, START_TIMEOUT_S, "the daemon's socket")
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    # -- clients -------------------------------------------------------------------
    def client(self) -> Client:
        return Client.connect(self.socket)

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        with self.client() as c:
            return c.call(op, **fields)

    def jobs(self, all_jobs: bool = False) -> list[dict[str, Any]]:
        return self.call("ps", all=all_jobs or None)["jobs"]

    def job(self, job_id: str) -> dict[str, Any]:
        return self.call("ps", job=job_id)["jobs"][0]

    def cli(self, *args: str, timeout: float = 60, env: dict[str, str] | None = None,
            **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run `vgpuctl ARGS` against this daemon; returns the finished process."""
        return subprocess.run([*vgpuctl_argv(), *args], env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=timeout, **kw)

    def popen(self, *args: str, env: dict[str, str] | None = None,
              **kw: Any) -> subprocess.Popen[str]:
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        return subprocess.Popen([*vgpuctl_argv(), *args], env={**self.env, **(env or {})},
                                text=True, **kw)

    def burner(self, core: int, kernel_us: int, seconds: int) -> subprocess.Popen[str]:
        """`vgpuctl run --mem 1G --core CORE` of vgpu-burn's kernels of
        kernel_us for seconds, started."""
        return self.popen("run", "--mem", "1G", "--core", str(core), "--",
                          str(native.burn_program()), "--kernel-us", str(kernel_us),
                          "--seconds", str(seconds))

    def running_job(self, timeout: float = 10.0, what: str = "the job") -> dict[str, Any]:
        """The first job with a process, once there is one."""
        return wait_for(lambda: next((j for j in self.jobs() if j["pids"]), None), timeout, what)

    def cleanup_jobs(self) -> None:
        """Kill whatever the jobs left running (by the pids the daemon knows)."""
        try:
            jobs = self.jobs()
        except Exception:
            return
        for j in jobs:
            for pid in j.get("pids", []):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


@pytest.fixture
def daemon_factory():
    """Start daemons (each in its own dir) and clean them all up."""
    made: list[tuple[Daemon, Path]] = []

    def make(gpus: str = "2x16G", config: str = "", start: bool = True,
             base: Path | None = None) -> Daemon:
        if base is None:
            base = Path(tempfile.mkdtemp(prefix="vgpu-test-", dir="/tmp"))
            os.chmod(base, 0o755)
        d = Daemon(base, gpus, config)
        made.append((d, base))
        return d.start() if start else d
    yield make
    for d, base in made:
        if d.proc is not None:
            if d.proc.poll() is None:
                d.cleanup_jobs()
            d.stop(signal.SIGKILL)
        discard_regions(d.runtime / "jobs")
        shutil.rmtree(base, ignore_errors=True)


def discard_regions(jobs_dir: Path) -> None:
    """Remove the regions a killed daemon left (their shared memory
    outlives every process otherwise)."""
    from vgpuctl.system.region import Region

    if jobs_dir.is_dir():
        for p in jobs_dir.iterdir():
            Region.discard(p)


@pytest.fixture
def daemon(daemon_factory):
    """One daemon over two simulated 16 GiB GPUs."""
    return daemon_factory()
