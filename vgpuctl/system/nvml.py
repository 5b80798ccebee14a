"""The node's GPUs, through NVML (the ``pynvml`` module of nvidia-ml-py).

``Nvml()`` initialises NVML once (the simulated one when ``VGPU_SIM`` is set)
and reads the inventory: each GPU's index, UUID, name, memory total and used,
utilization, and the memory each process holds on it. Every reading that a
GPU does not support is left as None rather than failing the whole snapshot.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from vgpuctl.errors import NvmlUnavailable


@dataclass(frozen=True)
class GpuStats:
    index: int
    uuid: str
    name: str
    memory_total: int                 # bytes
    memory_used: int | None = None    # bytes, as NVML reports for the whole GPU
    utilization: int | None = None    # percent over NVML's last sample period
    processes: dict[int, int] = field(default_factory=dict)  # pid -> bytes used
    minor: int | None = None          # /dev/nvidia<minor>; None: unknown


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class Nvml:
    """An initialised NVML. Thread-safe (one lock: pynvml calls are short)."""

    def __init__(self) -> None:
        from vgpuctl.system import sim

        sim.use_in_process()
        try:
            import pynvml
        except ImportError as e:  # pragma: no cover - a declared dependency
            raise NvmlUnavailable(f"NVML bindings missing: {e}") from None
        self._nv = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise NvmlUnavailable(
                f"NVML unavailable ({e}): no NVIDIA driver here? "
                "Set VGPU_SIM=1x16G to use the simulated GPU") from None
        self._lock = threading.Lock()
        self._handles: list[Any] = []
        self._static: list[GpuStats] = []
        nv = pynvml
        with self._lock:
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                self._handles.append(h)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                try:
                    minor: int | None = int(nv.nvmlDeviceGetMinorNumber(h))
                except nv.NVMLError:
                    minor = None
                self._static.append(GpuStats(
                    index=i, uuid=_text(nv.nvmlDeviceGetUUID(h)),
                    name=_text(nv.nvmlDeviceGetName(h)), memory_total=int(mem.total),
                    minor=minor))

    @property
    def module(self) -> Any:
        """The initialised pynvml module (for a reader of its own, such as
        the violation watch's utilization sampler)."""
        return self._nv

    def devices(self) -> list[GpuStats]:
        """The GPUs as found at start (index, uuid, name, total)."""
        return list(self._static)

    def snapshot(self, processes: bool = True) -> list[GpuStats]:
        """Every GPU with its current memory use, utilization and (when
        processes) the memory each process holds."""
        nv = self._nv
        out = []
        with self._lock:
            for g, h in zip(self._static, self._handles, strict=True):
                used = util = None
                procs: dict[int, int] = {}
                try:
                    used = int(nv.nvmlDeviceGetMemoryInfo(h).used)
                except nv.NVMLError:
                    pass
                try:
                    util = int(nv.nvmlDeviceGetUtilizationRates(h).gpu)
                except nv.NVMLError:
                    pass
                if processes:
                    try:
                        for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
                            mem = p.usedGpuMemory
                            procs[int(p.pid)] = procs.get(int(p.pid), 0) + int(mem or 0)
                    except nv.NVMLError:
                        pass
                out.append(GpuStats(g.index, g.uuid, g.name, g.memory_total, used, util, procs,
                                    g.minor))
        return out

    def close(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except Exception:
            pass


def query() -> list[GpuStats]:
    """One snapshot, for a command that runs without a daemon."""
    nv = Nvml()
    try:
        return nv.snapshot(processes=False)
    finally:
        nv.close()
