"""A job's shared region, read and written through cffi from the very header
the hook is compiled with (libvgpu/include/vgpu/region.h), so the two sides
cannot drift.

Two files per job directory:
  limits  written here (the daemon) only; mode 0644; the job maps it read-only
  usage   written by the hook with atomics; owned by the job's user, mode 0600

The usage file is the job's to write, truncate or fill with anything: the
daemon never maps it (a truncated map kills the reader with SIGBUS). It reads
it with bounded ``pread`` calls of a fixed size into its own memory and
validates what it got: a short read, a wrong magic or a counter out of any
physically possible range raises `BadRegion`, which is that job's problem
(the daemon flags it and closes its gate), never the daemon's. See
docs/security.md, "The usage region".
"""

from __future__ import annotations

import json
import mmap
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cffi

from vgpuctl.system import native

LIMITS_FILE = "limits"
USAGE_FILE = "usage"
# The job's signal to the jobs of lower classes on its GPUs (the job's own
# file, readable by all: vgpuctl.system.priority).
SIGNAL_FILE = "signal"
# The daemon's checkpoint of the hook's counters (owner-only: the daemon's).
CHECKPOINT_FILE = "checkpoint"

# No GPU holds a pebibyte: a byte counter above this is a lie, not a reading.
MAX_BYTES = 1 << 50
# Counters are saturated here (exact in a double, and in SQLite's INTEGER).
MAX_COUNT = 1 << 53


class BadRegion(ValueError):
    """A job's usage region holds what the hook never writes (truncated,
    wrong magic, a counter out of range): the job tampered with it."""


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


def _bytes(v: int, what: str) -> int:
    if v > MAX_BYTES:
        raise BadRegion(f"{what} = {v} bytes, more than any GPU holds")
    return int(v)


def _count(v: int) -> int:
    return min(int(v), MAX_COUNT)


def _device_usage(d: Any) -> DeviceUsage:
    used = _bytes(d.used, "used")
    peak = _bytes(d.peak, "peak")
    return DeviceUsage(used=used, peak=max(peak, used), tokens=int(d.tokens),
                       launches=_count(d.launches), throttled_ns=_count(d.throttled_ns),
                       oom_refusals=_count(d.oom_refusals))


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

    def __init__(self, path: Path, limits_map: mmap.mmap, usage_fd: int | None) -> None:
        f = ffi()
        self.path = path
        self._lmap = limits_map
        self._ufd = usage_fd
        self.limits = f.cast("struct vgpu_limits *", f.from_buffer(limits_map))

    @property
    def usage_readable(self) -> bool:
        return self._ufd is not None

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
        ssize = f.sizeof("struct vgpu_signal")
        max_dev = const("VGPU_MAX_DEVICES")
        if len(devices) > max_dev:
            raise ValueError(f"at most {max_dev} devices per job")
        for name, size, mode in ((LIMITS_FILE, lsize, 0o644), (USAGE_FILE, usize, 0o600),
                                 (SIGNAL_FILE, ssize, 0o644)):
            tmp = path / f".{name}.tmp"
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)
            try:
                os.ftruncate(fd, size)
                os.fchmod(fd, mode)
                if name in (USAGE_FILE, SIGNAL_FILE):
                    head = f.new("struct vgpu_usage *")
                    head.magic = const("VGPU_REGION_MAGIC")
                    head.version = const("VGPU_REGION_VERSION")
                    os.pwrite(fd, bytes(f.buffer(head, f.offsetof("struct vgpu_usage", "dev"))),
                              0)
                    if os.geteuid() == 0 and owner_uid != 0:
                        os.fchown(fd, owner_uid, -1)
            finally:
                os.close(fd)
        lmap = _map(path / f".{LIMITS_FILE}.tmp", lsize, True)
        ufd = os.open(path / f".{USAGE_FILE}.tmp", os.O_RDONLY | os.O_CLOEXEC)
        reg = cls(path, lmap, ufd)
        lim = reg.limits
        lim.version = const("VGPU_REGION_VERSION")
        jid = job_id.encode()[: const("VGPU_JOB_ID_LEN") - 1]
        f.memmove(lim.job_id, jid, len(jid))
        lim.owner_uid = owner_uid
        reg.set_devices(devices)
        lim.magic = const("VGPU_REGION_MAGIC")
        os.rename(path / f".{USAGE_FILE}.tmp", path / USAGE_FILE)
        os.rename(path / f".{SIGNAL_FILE}.tmp", path / SIGNAL_FILE)
        os.rename(path / f".{LIMITS_FILE}.tmp", path / LIMITS_FILE)
        return reg

    @classmethod
    def open(cls, path: Path | str, writable_limits: bool = False) -> Region:
        f = ffi()
        path = Path(path)
        lmap = _map(path / LIMITS_FILE, f.sizeof("struct vgpu_limits"), writable_limits)
        try:
            ufd: int | None = os.open(path / USAGE_FILE,
                                      os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
        except PermissionError:
            ufd = None
        except OSError:
            lmap.close()
            raise
        reg = cls(path, lmap, ufd)
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

    # -- usage (written by the hook: untrusted) ---------------------------------
    def _pread(self, offset: int, size: int) -> bytes:
        """Exactly ``size`` bytes of the usage file at ``offset``, copied into
        the daemon's memory; BadRegion when the file is shorter (truncated)
        or not a regular file."""
        if self._ufd is None:
            raise PermissionError(f"{self.path / USAGE_FILE}: not readable")
        try:
            st = os.fstat(self._ufd)
            if not stat.S_ISREG(st.st_mode):
                raise BadRegion("the usage file is not a regular file")
            data = os.pread(self._ufd, size, offset)
        except OSError as e:
            raise BadRegion(f"the usage file can't be read: {e.strerror}") from None
        if len(data) != size:
            raise BadRegion(f"the usage file is truncated ({st.st_size} bytes, "
                            f"{ffi().sizeof('struct vgpu_usage')} expected)")
        return data

    def _read(self, end_field: str | None = None) -> Any:
        """The usage struct up to ``end_field`` (everything when None), as a
        private copy, its header checked."""
        f = ffi()
        size = (f.offsetof("struct vgpu_usage", end_field) if end_field
                else f.sizeof("struct vgpu_usage"))
        buf = f.new("struct vgpu_usage *")
        f.memmove(buf, self._pread(0, size), size)
        if buf.magic != const("VGPU_REGION_MAGIC") or buf.version != const("VGPU_REGION_VERSION"):
            raise BadRegion("the usage file's header was overwritten")
        return buf

    def _ndevices(self) -> int:
        return min(int(self.limits.ndevices), const("VGPU_MAX_DEVICES"))

    def read_devices(self) -> list[DeviceUsage]:
        """The job-wide counters of each of the job's GPUs, validated: one
        bounded read of the header and device counters (cheap enough for
        every job on every tick)."""
        u = self._read("procs")
        return [_device_usage(u.dev[i]) for i in range(self._ndevices())]

    def read_usage(self) -> Usage:
        u = self._read()
        n = self._ndevices()
        devs = [_device_usage(u.dev[i]) for i in range(n)]
        procs = []
        for i in range(const("VGPU_MAX_PROCS")):
            s = u.procs[i]
            if s.pid > 0:
                procs.append(ProcUsage(
                    pid=s.pid, start_time=s.start_time,
                    used=[_bytes(s.used[j], "slot used") for j in range(n)],
                    ctx_bytes=[_bytes(s.ctx_bytes[j], "slot ctx_bytes") for j in range(n)],
                    launches=[_count(s.launches[j]) for j in range(n)],
                    allocs=_count(s.allocs), get_proc_calls=_count(s.get_proc_calls)))
        return Usage(devs, procs)

    def slot_pids(self) -> list[tuple[int, int]]:
        """(pid, start_time) of every claimed process slot: one bounded read
        of the slots (cheap enough to call for every job on every pass).
        Anything may be written there: callers check each pid's owner."""
        if self._ufd is None:
            return []
        f = ffi()
        base = f.offsetof("struct vgpu_usage", "procs")
        size = f.sizeof("struct vgpu_proc_slot")
        off_start = f.offsetof("struct vgpu_proc_slot", "start_time")
        n = const("VGPU_MAX_PROCS")
        data = self._pread(base, n * size)
        # Every slot's pid in one strided view (pid is the slot's first field).
        assert f.offsetof("struct vgpu_proc_slot", "pid") == 0 and size % 4 == 0
        mv = memoryview(data)
        pids = mv.cast("i")[::size // 4].tolist()
        out = []
        for i, pid in enumerate(pids):
            if pid > 0:
                at = i * size + off_start
                out.append((pid, int.from_bytes(data[at:at + 8], "little")))
        return out

    # -- the daemon's checkpoint -------------------------------------------------
    def write_checkpoint(self, data: dict[str, Any]) -> None:
        """Keep ``data`` (JSON) beside the region, in the daemon's own file
        (the job's user can't write the directory), replaced atomically."""
        tmp = self.path / f".{CHECKPOINT_FILE}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, json.dumps(data, separators=(",", ":")).encode())
        finally:
            os.close(fd)
        os.rename(tmp, self.path / CHECKPOINT_FILE)

    def read_checkpoint(self) -> dict[str, Any] | None:
        """The last checkpoint, or None (none yet, or unreadable)."""
        try:
            with open(self.path / CHECKPOINT_FILE, "rb") as fh:
                data = json.loads(fh.read(1 << 20))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def slot_launches(self) -> list[dict[tuple[int, int], int]]:
        """Per device, each live slot's (pid, start time) and its cumulative
        launches (the hook counts every launch there, gated or not)."""
        u = self.read_usage()
        out: list[dict[tuple[int, int], int]] = [{} for _ in range(self._ndevices())]
        for p in u.procs:
            for i, n in enumerate(p.launches):
                out[i][(p.pid, p.start_time)] = n
        return out

    def close(self) -> None:
        self.limits = None
        if self._lmap is not None:
            try:
                self._lmap.close()
            except BufferError:
                pass
        if self._ufd is not None:
            os.close(self._ufd)
            self._ufd = None

    def remove(self) -> None:
        """Delete the region's files and directory."""
        self.close()
        for name in (LIMITS_FILE, USAGE_FILE, SIGNAL_FILE, CHECKPOINT_FILE):
            try:
                os.unlink(self.path / name)
            except FileNotFoundError:
                pass
        try:
            os.rmdir(self.path)
        except OSError:
            pass
