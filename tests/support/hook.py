"""Fixtures and helpers shared by the tests of libvgpu.so (tests/test_hook_*.py).

Everything runs on the simulated GPU: a private state file per test, the
simulator's libcuda.so.1 / libnvidia-ml.so.1 first on LD_LIBRARY_PATH, and the
hook preloaded. The C clients in tests/c/ are compiled once per session.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from support import C_DIR, REPO
from support import daemon as daemon_fixture
from vgpuctl.core.turns import OPEN, Turn
from vgpuctl.system import native
from vgpuctl.system.limits import DeviceLimit
from vgpuctl.system.region import Region
from vgpuctl.system.turn_fields import write_turn

INCLUDE = REPO / "libvgpu" / "include"

MiB = 1 << 20
GiB = 1 << 30
CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_DEVICE_UNAVAILABLE = 46
CUDA_ERROR_NOT_PERMITTED = 800

# How the client reaches the driver: linked, dlopen+dlsym, cuGetProcAddress(_v2).
CLIENT_MODES = {
    "direct": [],
    "dlsym": ["-DVIA_DLSYM"],
    "gpa_v1": ["-DVIA_GPA=1"],
    "gpa_v2": ["-DVIA_GPA=2"],
}


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VGPU_", "CUDA_")) and k not in ("LD_PRELOAD",)}
    env.pop("LD_LIBRARY_PATH", None)
    return env


@pytest.fixture(scope="session")
def cbuild(tmp_path_factory: pytest.TempPathFactory):
    """compile(name, source, *flags, cuda=False) -> path of the program."""
    out = tmp_path_factory.mktemp("hook-bin")
    libdir = native.sim_libdir()
    built: dict[str, Path] = {}

    def compile_(name: str, source: str, *flags: str, cuda: bool = False,
                 shared: bool = False) -> Path:
        if name in built:
            return built[name]
        path = out / name
        cmd = ["gcc", "-std=gnu11", "-O2", "-g", "-Wall", "-Wextra", "-pthread",
               f"-I{INCLUDE}", *flags]
        if shared:
            cmd += ["-shared", "-fPIC"]
        cmd += ["-o", str(path), str(C_DIR / source)]
        if cuda:
            cmd += [f"-L{libdir}", "-l:libcuda.so.1"]
        cmd += ["-ldl"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert "warning" not in res.stderr, res.stderr
        built[name] = path
        return path

    return compile_


@pytest.fixture(scope="session")
def clients(cbuild) -> dict[str, Path]:
    """The cuclient program built for each way of reaching the driver."""
    return {mode: cbuild(f"cuclient_{mode}", "cuclient.c", *flags, cuda=(mode == "direct"))
            for mode, flags in CLIENT_MODES.items()}


@dataclass
class Sim:
    """A private simulated machine: its environment and its GPUs' UUIDs."""

    root: Path
    env: dict[str, str]
    uuids: list[str] = field(default_factory=list)
    made: list[Region] = field(default_factory=list)   # removed at the end of the test

    def job_env(self, region: Path | None = None, **extra: str) -> dict[str, str]:
        """The environment of a process of a job: the hook preloaded."""
        env = dict(self.env)
        env["LD_PRELOAD"] = str(native.hook_library())
        if region is not None:
            env["VGPU_REGION"] = str(region)
        env.update(extra)
        return env

    def stats(self) -> dict[str, Any]:
        """The simulator's own record (vgpu_sim_ctl_stats), read in a fresh
        process without the hook."""
        code = (
            "import ctypes, sys\n"
            f"lib = ctypes.CDLL({str(native.sim_libdir() / 'libcuda.so.1')!r})\n"
            "lib.cuInit(0)\n"
            "buf = ctypes.create_string_buffer(1 << 20)\n"
            "n = lib.vgpu_sim_ctl_stats(buf, len(buf))\n"
            "sys.stdout.write(buf.value.decode() if n >= 0 else 'null')\n")
        res = subprocess.run([sys.executable, "-c", code], env=self.env, capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    def probe(self) -> StatsProbe:
        """A process that reads the simulator's record on demand, within a
        millisecond or so (stats() starts a process each time)."""
        return StatsProbe(self.env)

    def process_used(self, pid: int, gpu: int = 0) -> int:
        for p in self.stats()["processes"]:
            if p["pid"] == pid:
                return int(p["devices"][gpu]["used"])
        return 0

    def region(self, limits: list[int] | dict[int, int], throttle: int = OPEN,
               ctx_overhead: int = 0, name: str = "region", owner: int | None = None,
               turn: Turn | dict[int, Turn] | None = None) -> Region:
        """A job region in root/name. limits: bytes per GPU index, in order
        (a list) or for some GPUs (a dict: physical index -> bytes).
        throttle: every device's gate (VGPU_GATE_*: OPEN, TURNS, CLOSED).
        turn: written after creation, as the daemon writes turns (its gate
        replaces throttle): one Turn for every device of the region, or a
        dict for some (the region's device index -> Turn)."""
        items = limits.items() if isinstance(limits, dict) else enumerate(limits)
        devs = [DeviceLimit(uuid=self.uuids[i], mem_limit=b, throttle=throttle,
                            ctx_overhead=ctx_overhead) for i, b in items]
        region = Region.create(self.root / name, "job-test",
                               os.getuid() if owner is None else owner, devs)
        self.made.append(region)
        if turn is not None:
            turns = turn if isinstance(turn, dict) else dict.fromkeys(range(len(devs)), turn)
            for i, t in turns.items():
                write_turn(region, i, t)
        return region

    def remove_regions(self) -> None:
        """Remove the regions made here: their shared memory outlives the
        test's processes otherwise."""
        for r in self.made:
            r.remove()
        self.made.clear()


def kill_and_close(proc: subprocess.Popen[Any]) -> None:
    """Kill proc if it still runs, reap it and close its pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None:
            f.close()


class StatsProbe:
    """The simulator's own record (vgpu_sim_ctl_stats), read on demand by one
    process started for it without the hook: a reading is taken within a
    millisecond or so of the request, so that a test can time a window of
    the timeline (compute shares over whole cycles of turns)."""

    CODE = (
        "import ctypes, sys\n"
        "lib = ctypes.CDLL(sys.argv[1])\n"
        "lib.cuInit(0)\n"
        "buf = ctypes.create_string_buffer(1 << 20)\n"
        "for _ in sys.stdin:\n"
        "    n = lib.vgpu_sim_ctl_stats(buf, len(buf))\n"
        "    sys.stdout.write((buf.value.decode() if n >= 0 else 'null') + '\\n')\n"
        "    sys.stdout.flush()\n")

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", self.CODE, str(native.sim_libdir() / "libcuda.so.1")],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)

    def read(self) -> tuple[int, dict[str, Any]]:
        """(CLOCK_MONOTONIC ns when it was read, the record)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        t0 = time.monotonic_ns()
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        line = daemon_fixture.read_line(self.proc.stdout, timeout=30)
        t1 = time.monotonic_ns()
        if not line:
            raise AssertionError(f"the stats probe ended: {self.stderr_now()}")
        return (t0 + t1) // 2, json.loads(line)

    def busy_ns(self, tags: list[str], gpu: int = 0) -> tuple[int, dict[str, int]]:
        """(when, each tag's kernel time on GPU gpu so far; 0 before any)."""
        when, stats = self.read()
        busy = {t["name"]: int(t["devices"][gpu]["busy_ns"]) for t in stats["tags"]}
        return when, {tag: busy.get(tag, 0) for tag in tags}

    def stderr_now(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return "(running)"
        return self.proc.stderr.read()

    def close(self) -> None:
        kill_and_close(self.proc)

    def __enter__(self) -> StatsProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_sim(root: Path, spec: str = "2x16G", **extra: str) -> Sim:
    env = clean_env()
    env.update({"VGPU_SIM": spec, "VGPU_SIM_STATE": str(root / "simstate"),
                "LD_LIBRARY_PATH": str(native.sim_libdir())})
    env.update(extra)
    sim = Sim(root, env)
    sim.uuids = [d["uuid"] for d in sim.stats()["devices"]]
    return sim


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Sim]:
    """Two simulated 16 GiB GPUs of our own (private state file)."""
    s = make_sim(tmp_path)
    yield s
    s.remove_regions()


# ---- running the clients --------------------------------------------------------

def parse(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.strip()]


def results(out: str, command: str) -> list[list[str]]:
    """The result lines of one command: [[rc, values...], ...]."""
    return [f[1:] for f in parse(out) if f[0] == command]


def run(program: Path, args: list[str], env: dict[str, str],
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(program), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


class Client:
    """A client run step by step: it stops at each `hold` until told to go on."""

    def __init__(self, program: Path, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([str(program), *args], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: list[list[str]] = []   # every line read so far
        self._consumed = 0                  # lines until() has gone past
        self._buf = b""
        self._sel = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self, timeout: float) -> bool:
        """Read what the client printed within timeout seconds into lines;
        False when nothing came (or its output ended)."""
        assert self.proc.stdout is not None
        if not self._sel.select(timeout=timeout):
            return False
        chunk = os.read(self.proc.stdout.fileno(), 65536)
        if not chunk:
            return False
        self._buf += chunk
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            self.lines.append(line.decode().split())
        return True

    def until(self, command: str, timeout: float = 30) -> list[str]:
        """Read output up to the next line of `command`; return its fields."""
        deadline = time.monotonic() + timeout
        while True:
            while self._consumed < len(self.lines):
                fields = self.lines[self._consumed]
                self._consumed += 1
                if fields and fields[0] == command:
                    return fields[1:]
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                break
        raise AssertionError(f"no '{command}' line; output so far {self.lines}, "
                             f"stderr {self.stderr_now()}")

    def printed(self, command: str) -> bool:
        """Whether the client has printed a `command` line by now. Reads
        whatever output is already there, never waits for more."""
        while self._read(0):
            pass
        return any(fields[:1] == [command] for fields in self.lines)

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"\n")
        self.proc.stdin.flush()

    def stderr_now(self) -> str:
        if self.proc.poll() is None:
            return "(running)"
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode()

    def finish(self, timeout: float = 60) -> tuple[int, str, str]:
        self._sel.close()
        out, err = self.proc.communicate(timeout=timeout)
        text = (self._buf + out).decode()
        self._buf = b""
        self.lines.extend(parse(text))
        return self.proc.returncode, text, err.decode()

    def kill(self) -> None:
        kill_and_close(self.proc)


@pytest.fixture
def client_factory() -> Iterator[Any]:
    started: list[Client] = []

    def start(program: Path, args: list[str], env: dict[str, str]) -> Client:
        c = Client(program, args, env)
        started.append(c)
        return c

    yield start
    for c in started:
        c.kill()


def wait_for(cond: Any, timeout: float = 20, what: str = "condition") -> Any:
    """daemon_fixture.wait_for with the hook tests' longer default deadline."""
    return daemon_fixture.wait_for(cond, timeout, what)


def slot_of(region: Region, pid: int) -> Any:
    for p in region.read_usage().procs:
        if p.pid == pid:
            return p
    return None
