"""Selecting the simulated GPU.

``VGPU_SIM=2x16G`` (count x memory per GPU) makes vgpuctl and everything it
launches use simulated GPUs: children get the simulator's folder first on
``LD_LIBRARY_PATH``, and this process loads the simulator's NVML before
pynvml looks for one. The device state is one shared-memory file
(``VGPU_SIM_STATE``, default ``/dev/shm/vgpu-sim-<uid>``) that every process
on the machine maps. See docs/simulator.md.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from vgpuctl.core.sizes import parse_size
from vgpuctl.errors import SimError
from vgpuctl.system import native

_SPEC = re.compile(r"^\s*(\d+)\s*[xX]\s*(\S+)\s*$")


@dataclass(frozen=True)
class SimSpec:
    count: int
    memory: int  # bytes per GPU


def parse_spec(text: str) -> SimSpec:
    """Parse ``2x16G`` into a SimSpec; raise SimError on anything else."""
    m = _SPEC.match(text)
    if not m:
        raise SimError(f"VGPU_SIM={text!r}: expected COUNTxSIZE, for example 2x16G")
    count = int(m.group(1))
    if not 1 <= count <= 16:
        raise SimError(f"VGPU_SIM={text!r}: GPU count must be 1 to 16")
    try:
        memory = parse_size(m.group(2))
    except ValueError as e:
        raise SimError(f"VGPU_SIM={text!r}: {e}") from None
    if memory < 256 << 20:
        raise SimError(f"VGPU_SIM={text!r}: each GPU needs at least 256M")
    return SimSpec(count, memory)


def context_cost(env: MutableMapping[str, str] | None = None) -> int:
    """Bytes the simulator charges per context (VGPU_SIM_CTX_MEM, 300M by
    default, 0 for none), as libcuda.so.1 reads it."""
    text = (env if env is not None else os.environ).get("VGPU_SIM_CTX_MEM", "").strip()
    if text == "0":
        return 0
    try:
        return parse_size(text) if text else 300 << 20
    except ValueError:
        return 300 << 20


def active(env: Mapping[str, str] | None = None) -> bool:
    """True when VGPU_SIM selects the simulated GPU."""
    return bool((env if env is not None else os.environ).get("VGPU_SIM"))


def child_env(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Return env with the simulator's libraries first on LD_LIBRARY_PATH when
    VGPU_SIM is set (validated); env unchanged otherwise."""
    spec = env.get("VGPU_SIM")
    if not spec:
        return env
    parse_spec(spec)
    libdir = str(native.sim_libdir())
    old = env.get("LD_LIBRARY_PATH", "")
    parts = [p for p in old.split(":") if p and p != libdir]
    env["LD_LIBRARY_PATH"] = ":".join([libdir, *parts])
    return env


_loaded: list[ctypes.CDLL] = []


def use_in_process() -> None:
    """Load the simulator's NVML (and driver) into this process, so that
    pynvml's own ``dlopen("libnvidia-ml.so.1")`` finds it by its soname.
    A no-op unless VGPU_SIM is set."""
    if not active() or _loaded:
        return
    parse_spec(os.environ["VGPU_SIM"])
    libdir = native.sim_libdir()
    for name in ("libnvidia-ml.so.1", "libcuda.so.1"):
        _loaded.append(ctypes.CDLL(str(libdir / name), mode=ctypes.RTLD_GLOBAL))
