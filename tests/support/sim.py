"""Helpers for the simulated-GPU tests (tests/sim): run a snippet of
Python that uses cuda-bindings or pynvml in a subprocess on the simulated GPU
(a process loads one libcuda for life), and hold a process on the GPU while a
test looks at it from another one."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from support.daemon import wait_for

# The command line, run with this interpreter (no PATH needed).
VGPUCTL = [sys.executable, "-c", "from vgpuctl.cli import main; main()"]

# Every snippet starts with this: the driver API, NVML, `out` to report, and
# `wait_for` (support.daemon.wait_for's own source, in the snippet's process).
PRELUDE = """
from __future__ import annotations
import ctypes, json, os, sys, time
from typing import Any, Callable
def out(value):
    print(json.dumps(value), flush=True)
""" + inspect.getsource(wait_for) + """
try:
    from cuda.bindings import driver as cu
    def ck(r):
        if r[0] != cu.CUresult.CUDA_SUCCESS:
            raise SystemExit(f"driver call failed: {r[0]!r}")
        return r[1] if len(r) == 2 else (r[1:] if len(r) > 2 else None)
    def err(r):
        return (r[0] if isinstance(r, tuple) else r).name
except ImportError:
    pass
"""

# Holds 1 GiB on GPU 1 and reports its pid.
HOLD_1G_ON_GPU1 = """
ck(cu.cuInit(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(1)); ck(cu.cuCtxSetCurrent(ctx))
p = ck(cu.cuMemAlloc(1 << 30))
out({"pid": os.getpid()})
"""

# A spin kernel, as vgpu-burn embeds it: runs for its u64 argument in ns.
SPIN_PTX = rb"""
.version 7.0
.target sm_50
.address_size 64
.visible .entry vgpu_spin(.param .u64 ns)
{
    ret;
}
.visible .entry work(.param .u64 buf, .param .u32 n)
{
    ret;
}
"""


# GPU 0's primary context made current and SPIN_PTX loaded: `fn`, its spin
# kernel, and spin(ns, stream=0), a launch of it for ns on the stream.
SPIN_ON_GPU0 = f"""
ck(cu.cuInit(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(0))
ck(cu.cuCtxSetCurrent(ctx))
mod = ck(cu.cuModuleLoadData({SPIN_PTX!r}))
fn = ck(cu.cuModuleGetFunction(mod, b"vgpu_spin"))
def spin(ns, stream=0):
    return cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, ((ns,), (ctypes.c_uint64,)), 0)
"""


def script(*parts: str) -> str:
    """PRELUDE and the parts, each dedented, as one program."""
    return PRELUDE + "".join(textwrap.dedent(p) for p in parts)


def run_py(env: dict[str, str], *parts: str, timeout: float = 60) -> Any:
    """Run the parts (after PRELUDE) in a subprocess with env; return the
    value of the last JSON line it printed (with out())."""
    res = subprocess.run([sys.executable, "-c", script(*parts)], env=env,
                         capture_output=True, text=True, timeout=timeout, check=False)
    if res.returncode != 0:
        raise AssertionError(f"snippet failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    return json.loads(lines[-1]) if lines else None


class Holder:
    """A process that runs `code` on the simulated GPU, reports with out(),
    then keeps everything it holds until stop() (or kill())."""

    def __init__(self, env: dict[str, str], *parts: str) -> None:
        program = script(*parts, "\nsys.stdin.readline()\n")
        self.proc = subprocess.Popen([sys.executable, "-c", program], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"holder failed to start: {err}")
        self.report = json.loads(line)
        self.pid = self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=30)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


@contextmanager
def holding(env: dict[str, str], *parts: str) -> Iterator[Holder]:
    """A Holder for the block; killed at its end if still running."""
    h = Holder(env, *parts)
    try:
        yield h
    finally:
        if h.proc.poll() is None:
            h.kill()


def burn(env: dict[str, str], program: str, *args: str, timeout: float = 60) -> dict[str, Any]:
    """Run vgpu-burn; return its JSON line (plus its exit status as "rc")."""
    res = subprocess.run([program, *args], env=env, capture_output=True, text=True,
                         timeout=timeout, check=False)
    lines = res.stdout.strip().splitlines()
    out = json.loads(lines[-1]) if lines else {}
    out["rc"] = res.returncode
    out["stderr"] = res.stderr
    return out


def busy_by_tag(env: dict[str, str]) -> dict[str, float]:
    """Seconds of kernel time per VGPU_SIM_TAG on the simulated GPU of env,
    from the simulator's own timeline (`vgpuctl sim stats --json`)."""
    res = subprocess.run([*VGPUCTL, "sim", "stats", "--json"], env=env, capture_output=True,
                         text=True, timeout=60, check=False)
    if res.returncode != 0:
        raise AssertionError(f"vgpuctl sim stats failed: {res.stderr}")
    return {t["name"]: sum(d["busy_ns"] for d in t["devices"] + t.get("mig_devices", [])) / 1e9
            for t in json.loads(res.stdout)["tags"]}


def shares_over(env: dict[str, str], seconds: float) -> dict[str, float]:
    """Each VGPU_SIM_TAG's share (%) of GPU time over the next `seconds`, the
    measurement window, from busy_by_tag at its start and its end."""
    t0, a = time.monotonic(), busy_by_tag(env)
    time.sleep(seconds)  # the measurement window
    t1, b = time.monotonic(), busy_by_tag(env)
    return {t: 100 * (b[t] - a[t]) / (t1 - t0) for t in b if t in a}
