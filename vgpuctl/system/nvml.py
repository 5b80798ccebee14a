"""The node's GPUs, through NVML (the ``pynvml`` module of nvidia-ml-py).

``Nvml()`` initialises NVML once (the simulated one when ``VGPU_SIM`` is set)
and reads the inventory: each GPU's index, UUID, name, memory total and used,
utilization, and the memory each process holds on it. Every reading that a
GPU does not support is left as None rather than failing the whole snapshot.

A GPU in MIG mode is not a GPU a job can use (CUDA enumerates its MIG
devices, not it): its MIG devices are, each one a GPU of the inventory with
its parent's index and its profile (docs/mig.md). A MIG device's index is
``count + 8 * parent + start``, where count is the node's GPUs and start the
first slice of its GPU instance's placement: the same for as long as the
instance lives, whatever else is created or destroyed, and the same again
when a layout is made anew.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any

from vgpuctl.core import placement
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
    minor: int | None = None          # /dev/nvidia<minor> (a MIG device's: its GPU's)
    parent: int | None = None         # a MIG device: its GPU's index
    mig: str | None = None            # ...its profile ("1g.10gb")
    gi: int | None = None             # ...its GPU instance's id
    ci: int | None = None             # ...its compute instance's id

    def as_gpu(self) -> placement.Gpu:
        """The GPU as placement reads it."""
        return placement.Gpu(self.index, self.uuid, self.name, self.memory_total, self.parent,
                             self.mig)


# MIG devices per GPU at most (H100, H200: seven GPU instances) and the
# index room each GPU gets for them (its GPU instances' placement starts).
MIG_SLOTS = 8


def mig_index(count: int, parent: int, start: int) -> int:
    """The inventory index of the MIG device whose GPU instance starts at
    slice ``start`` of GPU ``parent``, on a node of ``count`` GPUs."""
    return count + MIG_SLOTS * parent + start


def mig_mode(nv: Any, h: Any) -> bool:
    """Whether the GPU behind handle h is in MIG mode now (False where NVML
    knows no MIG: an older GPU or driver)."""
    try:
        return int(nv.nvmlDeviceGetMigMode(h)[0]) == 1
    except (nv.NVMLError, AttributeError):
        return False


def _mig_devices(nv: Any, count: int, parent: int, h: Any,
                 minor: int | None) -> list[tuple[Any, GpuStats]]:
    """The MIG devices of GPU ``parent`` (handle h, device minor ``minor``),
    each with its handle. NVML's indexes have gaps where no compute instance
    is (NOT_FOUND)."""
    try:
        n = int(nv.nvmlDeviceGetMaxMigDeviceCount(h))
    except nv.NVMLError:
        return []
    out: list[tuple[Any, GpuStats]] = []
    taken: set[int] = set()
    for k in range(n):
        try:
            m = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
        except nv.NVMLError:
            continue
        try:
            uuid = nvml_text(nv.nvmlDeviceGetUUID(m))
            name = nvml_text(nv.nvmlDeviceGetName(m))
            total = int(nv.nvmlDeviceGetMemoryInfo(m).total)
            gi = int(nv.nvmlDeviceGetGpuInstanceId(m))
            ci = int(nv.nvmlDeviceGetComputeInstanceId(m))
        except nv.NVMLError:
            continue                      # destroyed while read: not there
        start = _gi_start(nv, h, gi)
        index = mig_index(count, parent, start) if start is not None else None
        if index is None or index in taken:
            # a second compute instance of one GPU instance, or a start
            # NVML won't tell: an index past every placement's
            index = mig_index(count, count, len(taken))
            while index in taken:
                index += 1
        taken.add(index)
        out.append((m, GpuStats(index=index, uuid=uuid, name=name, memory_total=total,
                                minor=minor, parent=parent, mig=_profile_of(name), gi=gi,
                                ci=ci)))
    return out


def _gi_start(nv: Any, h: Any, gi: int) -> int | None:
    try:
        info = nv.nvmlGpuInstanceGetInfo(nv.nvmlDeviceGetGpuInstanceById(h, gi))
        start = int(info.placement.start)
    except (nv.NVMLError, AttributeError):
        return None
    return start if 0 <= start < MIG_SLOTS else None


def _profile_of(name: str) -> str | None:
    """The profile in a MIG device's name ("NVIDIA H100 80GB HBM3 MIG
    1g.10gb": "1g.10gb")."""
    _, sep, tail = name.rpartition(" MIG ")
    return tail.strip() or None if sep else None


def nvml_text(v: Any) -> str:
    """A string NVML returned (bytes from older pynvml, str from newer)."""
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
        with self._lock:
            self._read_inventory()

    def _read_inventory(self) -> None:
        nv = self._nv
        handles: list[Any] = []
        static: list[GpuStats] = []
        count = nv.nvmlDeviceGetCount()
        for i in range(count):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            try:
                minor: int | None = int(nv.nvmlDeviceGetMinorNumber(h))
            except nv.NVMLError:
                minor = None
            if mig_mode(nv, h):
                for m, g in _mig_devices(nv, count, i, h, minor):
                    handles.append(m)
                    static.append(g)
                continue
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            handles.append(h)
            static.append(GpuStats(
                index=i, uuid=nvml_text(nv.nvmlDeviceGetUUID(h)),
                name=nvml_text(nv.nvmlDeviceGetName(h)), memory_total=int(mem.total),
                minor=minor))
        order = sorted(range(len(static)), key=lambda k: static[k].index)  # whole GPUs first
        self._handles = [handles[k] for k in order]
        self._static = [static[k] for k in order]

    def reread(self) -> list[GpuStats]:
        """Read the inventory again (after MIG instances were made or
        destroyed); returns the GPUs as devices() does."""
        with self._lock:
            self._read_inventory()
            return list(self._static)

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
                out.append(replace(g, memory_used=used, utilization=util, processes=procs))
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
