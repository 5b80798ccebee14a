"""A job's shared region, read and written through cffi from the very header
the hook is compiled with (libvgpu/include/vgpu/region.h), so the two sides
cannot drift.

Two files per job directory:
  limits  written here (the daemon) only; mode 0644; the job maps it read-only
  usage   written by the hook with atomics; owned by the job's user, mode 0600
"""

from __future__ import annotations

import mmap
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cffi

from vgpuctl.system import native

LIMITS_FILE = "limits"
USAGE_FILE = "usage"


def _cdef_source(text: str) -> str:
    """The header as cffi's cdef accepts it: comments and preprocessor lines
    dropped, except `#define NAME <integer>`."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    out = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#"):
            if re.match(r"#define\s+\w+\s+(0x[0-9a-fA-F]+|\d+)\s*$", s):
                out.append(s)
            continue
        out.append(line)
    return "\n".join(out)


_ffi: Any = None
_consts: dict[str, int] = {}


def ffi() -> Any:
    """The cffi instance that knows the region's structs."""
    global _ffi
    if _ffi is None:
        text = native.region_header().read_text()
        f = cffi.FFI()
        f.cdef(_cdef_source(text))
        for m in re.finditer(r"^#define\s+(VGPU_\w+)\s+(0x[0-9a-fA-F]+|\d+)\s*$", text, re.M):
            _consts[m.group(1)] = int(m.group(2), 0)
        _ffi = f
    return _ffi


def const(name: str) -> int:
    """An integer #define of region.h, by name."""
    ffi()
    return _consts[name]


@dataclass
class DeviceLimit:
    uuid: str
    mem_limit: int = 0          # bytes, 0 = none
    core_share: int = 100       # percent
    policy: int = 0             # VGPU_POLICY_HARD / VGPU_POLICY_SOFT
    throttle: bool = False
    refill_rate: int = 0        # tokens per second
    bucket_size: int = 0
    ctx_overhead: int = 0


@dataclass
class ProcUsage:
    pid: int
    start_time: int
    used: list[int]
    ctx_bytes: list[int]
    launches: list[int]
    allocs: int
    get_proc_calls: int


@dataclass
class DeviceUsage:
    used: int
    peak: int
    tokens: int
    launches: int
    throttled_ns: int
    oom_refusals: int


@dataclass
class Usage:
    devices: list[DeviceUsage]
    procs: list[ProcUsage] = field(default_factory=list)


def _map(path: Path, size: int, writable: bool) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    try:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        return mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
    finally:
        os.close(fd)


class Region:
    """One job's region. Create with Region.create (daemon), or open an
    existing one with Region.open."""

    def __init__(self, path: Path, limits_map: mmap.mmap, usage_map: mmap.mmap | None) -> None:
        f = ffi()
        self.path = path
        self._lmap = limits_map
        self._umap = usage_map
        self.limits = f.cast("struct vgpu_limits *", f.from_buffer(limits_map))
        self.usage = (f.cast("struct vgpu_usage *", f.from_buffer(usage_map))
                      if usage_map is not None else None)

    # -- creation and opening ------------------------------------------------
    @classmethod
    def create(cls, path: Path | str, job_id: str, owner_uid: int,
               devices: list[DeviceLimit]) -> Region:
        """Create the two files (atomically: written under temporary names,
        then renamed) and return the region, writable."""
        f = ffi()
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        lsize = f.sizeof("struct vgpu_limits")
        usize = f.sizeof("struct vgpu_usage")
        max_dev = const("VGPU_MAX_DEVICES")
        if len(devices) > max_dev:
            raise ValueError(f"at most {max_dev} devices per job")
        for name, size, mode in ((LIMITS_FILE, lsize, 0o644), (USAGE_FILE, usize, 0o600)):
            tmp = path / f".{name}.tmp"
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)
            try:
                os.ftruncate(fd, size)
                os.fchmod(fd, mode)
                if name == USAGE_FILE and os.geteuid() == 0 and owner_uid != 0:
                    os.fchown(fd, owner_uid, -1)
            finally:
                os.close(fd)
        lmap = _map(path / f".{LIMITS_FILE}.tmp", lsize, True)
        umap = _map(path / f".{USAGE_FILE}.tmp", usize, True)
        reg = cls(path, lmap, umap)
        lim = reg.limits
        lim.version = const("VGPU_REGION_VERSION")
        jid = job_id.encode()[: const("VGPU_JOB_ID_LEN") - 1]
        f.memmove(lim.job_id, jid, len(jid))
        lim.owner_uid = owner_uid
        reg.set_devices(devices)
        reg.usage.version = lim.version
        reg.usage.magic = const("VGPU_REGION_MAGIC")
        lim.magic = const("VGPU_REGION_MAGIC")
        os.rename(path / f".{USAGE_FILE}.tmp", path / USAGE_FILE)
        os.rename(path / f".{LIMITS_FILE}.tmp", path / LIMITS_FILE)
        return reg

    @classmethod
    def open(cls, path: Path | str, writable_limits: bool = False) -> Region:
        f = ffi()
        path = Path(path)
        lmap = _map(path / LIMITS_FILE, f.sizeof("struct vgpu_limits"), writable_limits)
        try:
            umap: mmap.mmap | None = _map(path / USAGE_FILE, f.sizeof("struct vgpu_usage"), False)
        except PermissionError:
            umap = None
        reg = cls(path, lmap, umap)
        if reg.limits.magic != const("VGPU_REGION_MAGIC"):
            raise ValueError(f"{path}: not a vgpu region")
        if reg.limits.version != const("VGPU_REGION_VERSION"):
            raise ValueError(f"{path}: region layout version {reg.limits.version}, "
                             f"expected {const('VGPU_REGION_VERSION')}")
        return reg

    # -- limits (daemon side) -------------------------------------------------
    def set_devices(self, devices: list[DeviceLimit]) -> None:
        f = ffi()
        lim = self.limits
        for i, d in enumerate(devices):
            self._write_dev(i, d)
        for i in range(len(devices), const("VGPU_MAX_DEVICES")):
            f.memmove(lim.dev[i].uuid, b"\0" * const("VGPU_UUID_LEN"),
                      const("VGPU_UUID_LEN"))
        lim.ndevices = len(devices)
        lim.generation += 1

    def _write_dev(self, i: int, d: DeviceLimit) -> None:
        f = ffi()
        dev = self.limits.dev[i]
        u = d.uuid.encode()[: const("VGPU_UUID_LEN") - 1]
        f.memmove(dev.uuid, u + b"\0" * (const("VGPU_UUID_LEN") - len(u)),
                  const("VGPU_UUID_LEN"))
        dev.mem_limit = d.mem_limit
        dev.ctx_overhead = d.ctx_overhead
        dev.core_share = d.core_share
        dev.policy = d.policy
        dev.refill_rate = d.refill_rate
        dev.bucket_size = d.bucket_size
        dev.throttle = 1 if d.throttle else 0

    def update_device(self, i: int, **changes: Any) -> None:
        """Change some fields of device i's limits live."""
        d = self.device(i)
        for k, v in changes.items():
            if not hasattr(d, k):
                raise AttributeError(k)
            setattr(d, k, v)
        self._write_dev(i, d)
        self.limits.generation += 1

    def device(self, i: int) -> DeviceLimit:
        f = ffi()
        dev = self.limits.dev[i]
        return DeviceLimit(
            uuid=f.string(dev.uuid).decode(), mem_limit=dev.mem_limit,
            core_share=dev.core_share, policy=dev.policy, throttle=bool(dev.throttle),
            refill_rate=dev.refill_rate, bucket_size=dev.bucket_size,
            ctx_overhead=dev.ctx_overhead)

    def devices(self) -> list[DeviceLimit]:
        return [self.device(i) for i in range(self.limits.ndevices)]

    @property
    def job_id(self) -> str:
        return ffi().string(self.limits.job_id).decode()

    # -- usage (written by the hook) -----------------------------------------
    def read_usage(self) -> Usage:
        if self.usage is None:
            raise PermissionError(f"{self.path / USAGE_FILE}: not readable")
        n = self.limits.ndevices
        u = self.usage
        devs = [DeviceUsage(used=d.used, peak=d.peak, tokens=d.tokens, launches=d.launches,
                            throttled_ns=d.throttled_ns, oom_refusals=d.oom_refusals)
                for d in (u.dev[i] for i in range(n))]
        procs = []
        for i in range(const("VGPU_MAX_PROCS")):
            s = u.procs[i]
            if s.pid > 0:
                procs.append(ProcUsage(
                    pid=s.pid, start_time=s.start_time,
                    used=[s.used[j] for j in range(n)],
                    ctx_bytes=[s.ctx_bytes[j] for j in range(n)],
                    launches=[s.launches[j] for j in range(n)],
                    allocs=s.allocs, get_proc_calls=s.get_proc_calls))
        return Usage(devs, procs)

    def slot_pids(self) -> list[tuple[int, int]]:
        """(pid, start_time) of every claimed process slot, read straight from
        the mapping (cheap enough to call for every job on every pass)."""
        if self._umap is None:
            return []
        f = ffi()
        base = f.offsetof("struct vgpu_usage", "procs")
        size = f.sizeof("struct vgpu_proc_slot")
        off_start = f.offsetof("struct vgpu_proc_slot", "start_time")
        n = const("VGPU_MAX_PROCS")
        mv = memoryview(self._umap)
        try:
            # Every slot's pid in one strided view (pid is the slot's first field).
            assert f.offsetof("struct vgpu_proc_slot", "pid") == 0 and size % 4 == 0
            pids = mv[base:base + n * size].cast("i")[::size // 4]
            out = []
            for i, pid in enumerate(pids.tolist()):
                if pid > 0:
                    at = base + i * size + off_start
                    out.append((pid, int.from_bytes(mv[at:at + 8], "little")))
            pids.release()
            return out
        finally:
            mv.release()

    def close(self) -> None:
        self.limits = None
        self.usage = None
        for m in (self._lmap, self._umap):
            if m is not None:
                try:
                    m.close()
                except BufferError:
                    pass

    def remove(self) -> None:
        """Delete the region's files and directory."""
        self.close()
        for name in (LIMITS_FILE, USAGE_FILE):
            try:
                os.unlink(self.path / name)
            except FileNotFoundError:
                pass
        try:
            os.rmdir(self.path)
        except OSError:
            pass
