"""A job's usage and signal segments: the job's to write with anything (its
hook writes them with atomics). Each read copies what it reads into the
daemon's memory and validates the copy: a wrong magic or a counter out of
any physically possible range raises `BadRegion`, that job's problem (the
daemon flags it and closes its gate), never the daemon's. See
docs/security.md, "The usage region"."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vgpuctl.core.job import DeviceUsage
from vgpuctl.system.structs import const, ffi

# No GPU holds a pebibyte: a byte counter above this is a lie, not a reading.
MAX_BYTES = 1 << 50
# Counters are saturated here (exact in a double, and in SQLite's INTEGER).
MAX_COUNT = 1 << 53


class BadRegion(ValueError):
    """A job's usage region holds what the hook never writes (wrong magic, a
    counter out of range): the job tampered with it."""


@dataclass
class ProcUsage:
    pid: int
    start_time: int
    used: list[int]
    ctx_bytes: list[int]
    launches: list[int]
    allocs: int
    get_proc_calls: int
    features: int = 0           # VGPU_FEATURE_* bits: what can't be checkpointed
    busy_ns: list[int] = field(default_factory=list)   # GPU time its hook measured


@dataclass
class UsageReading:
    devices: list[DeviceUsage]
    procs: list[ProcUsage] = field(default_factory=list)


def _bytes(v: int, what: str) -> int:
    if v > MAX_BYTES:
        raise BadRegion(f"{what} = {v} bytes, more than any GPU holds")
    return int(v)


def _slot_used(s: Any, d: int) -> int:
    """What a process slot holds on device d: its shared word and its
    lanes' (region.h), added modulo 2^64 and read as signed, as the hook
    reads it (a sum torn between two lanes of a running process may fall
    below 0: then 0)."""
    n = int(s.used[d])
    for lane in s.lane_used:
        n += int(lane[d])
    n %= 1 << 64
    return 0 if n >= 1 << 63 else n


def _count(v: int) -> int:
    return min(int(v), MAX_COUNT)


def _device_usage(d: Any) -> DeviceUsage:
    used = _bytes(d.used, "used")
    peak = _bytes(d.peak, "peak")
    return DeviceUsage(used=used, peak=max(peak, used),
                       launches=_count(d.launches), throttled_ns=_count(d.throttled_ns),
                       busy_ns=_count(d.busy_ns), cost_ns=_count(d.cost_ns),
                       borrowed_ns=_count(d.borrowed_ns),
                       oom_refusals=_count(d.oom_refusals))


_SLOTS: tuple[int, int, int, int] | None = None


def _slot_layout() -> tuple[int, int, int, int]:
    """(offset of the slots, a slot's size, offset of its start time, how
    many), from region.h."""
    global _SLOTS
    if _SLOTS is None:
        f = ffi()
        assert f.offsetof("struct vgpu_proc_slot", "pid") == 0
        size = f.sizeof("struct vgpu_proc_slot")
        assert size % 4 == 0
        _SLOTS = (f.offsetof("struct vgpu_usage", "procs"), size,
                  f.offsetof("struct vgpu_proc_slot", "start_time"), const("VGPU_MAX_PROCS"))
    return _SLOTS


class RegionUsage:
    """Region's usage and signal: read through a private copy, validated
    (the daemon), or written as the job's user can (tests)."""

    path: Path
    limits: Any
    _uaddr: int | None
    _uwritable: bool
    _saddr: int | None

    @property
    def usage_readable(self) -> bool:
        return self._uaddr is not None

    def _copy(self, offset: int, size: int) -> bytes:
        """size bytes of the usage segment at offset, copied into the
        daemon's memory (the segment can neither shrink nor move: the copy
        is all there is to check)."""
        if self._uaddr is None:
            raise PermissionError(f"{self.path}: the usage segment is not readable")
        return ctypes.string_at(self._uaddr + offset, size)

    def _read(self, end_field: str | None = None) -> Any:
        """The usage struct up to ``end_field`` (everything when None), as a
        private copy, its header checked."""
        f = ffi()
        size = (f.offsetof("struct vgpu_usage", end_field) if end_field
                else f.sizeof("struct vgpu_usage"))
        buf = f.new("struct vgpu_usage *")
        f.memmove(buf, self._copy(0, size), size)
        if buf.magic != const("VGPU_REGION_MAGIC") or buf.version != const("VGPU_REGION_VERSION"):
            raise BadRegion("the usage segment's header was overwritten")
        return buf

    def poke_usage(self, offset: int, data: bytes) -> None:
        """Write data into the usage segment at offset, as the hook (or
        anything the job's user runs) can: for tests and benchmarks of a
        region opened with writable_usage."""
        if self._uaddr is None or not self._uwritable:
            raise PermissionError(f"{self.path}: the usage segment is not attached writable")
        if offset < 0 or offset + len(data) > ffi().sizeof("struct vgpu_usage"):
            raise ValueError("outside the usage struct")
        ctypes.memmove(self._uaddr + offset, data, len(data))

    def signal_bytes(self) -> bytes | None:
        """The job's signal (struct vgpu_signal), copied into our memory;
        None when it is not attached. The job writes it: callers check it."""
        if self._saddr is None:
            return None
        return ctypes.string_at(self._saddr, ffi().sizeof("struct vgpu_signal"))

    def poke_signal(self, offset: int, data: bytes) -> None:
        """Write data into the signal segment at offset, as the job's user
        can: for tests of a region opened with writable_usage."""
        if self._saddr is None or not self._uwritable:
            raise PermissionError(f"{self.path}: the signal segment is not attached writable")
        if offset < 0 or offset + len(data) > ffi().sizeof("struct vgpu_signal"):
            raise ValueError("outside the signal struct")
        ctypes.memmove(self._saddr + offset, data, len(data))

    def _ndevices(self) -> int:
        return min(int(self.limits.ndevices), const("VGPU_MAX_DEVICES"))

    def read_devices(self) -> list[DeviceUsage]:
        """The job-wide counters of each of the job's GPUs, validated: one
        bounded copy of the header and device counters (cheap enough for
        every job on every tick)."""
        u = self._read("procs")
        return [_device_usage(u.dev[i]) for i in range(self._ndevices())]

    def read_usage(self) -> UsageReading:
        u = self._read()
        n = self._ndevices()
        devs = [_device_usage(u.dev[i]) for i in range(n)]
        procs = []
        for i in range(const("VGPU_MAX_PROCS")):
            s = u.procs[i]
            if s.pid > 0:
                procs.append(ProcUsage(
                    pid=s.pid, start_time=s.start_time,
                    used=[_bytes(_slot_used(s, j), "slot used") for j in range(n)],
                    ctx_bytes=[_bytes(s.ctx_bytes[j], "slot ctx_bytes") for j in range(n)],
                    launches=[_count(s.launches[j]) for j in range(n)],
                    allocs=_count(s.allocs), get_proc_calls=_count(s.get_proc_calls),
                    features=int(s.features),
                    busy_ns=[_count(s.busy_ns[j]) for j in range(n)]))
        return UsageReading(devs, procs)

    def slot_pids(self) -> list[tuple[int, int]]:
        """(pid, start_time) of every claimed process slot, read in place
        (cheap enough to call for every job on every tick: the pids are the
        only thing read of a free slot). Anything may be written there:
        callers check each pid's owner."""
        if self._uaddr is None:
            return []
        base, size, off_start, n = _slot_layout()
        raw = (ctypes.c_char * (n * size)).from_address(self._uaddr + base)
        mv = memoryview(raw).cast("B")
        pids = mv.cast("i")[::size // 4].tolist()    # pid is the slot's first field
        out = []
        for i, pid in enumerate(pids):
            if pid > 0:
                at = i * size + off_start
                out.append((pid, int.from_bytes(mv[at:at + 8], "little")))
        return out

    def slot_launches(self) -> list[dict[tuple[int, int], int]]:
        """Per device, each live slot's (pid, start time) and its cumulative
        launches (the hook counts every launch there, gated or not)."""
        u = self.read_usage()
        out: list[dict[tuple[int, int], int]] = [{} for _ in range(self._ndevices())]
        for p in u.procs:
            for i, n in enumerate(p.launches):
                out[i][(p.pid, p.start_time)] = n
        return out
