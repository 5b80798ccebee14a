"""A job's shared region, read and written through cffi from the very header
the hook is compiled with (libvgpu/include/vgpu/region.h), so the two sides
cannot drift.

The region's three structs live in System V shared memory, one segment
each, created by the daemon; the job's directory holds only the daemon's
small files:

  region      "vgpu-region VERSION LIMITS_ID USAGE_ID SIGNAL_ID": the three
              segments (the daemon's file, mode 0644)
  checkpoint  the daemon's record of the hook's counters (mode 0600)

and the segments:

  limits  written here (the daemon) only; owned by the daemon's user, mode
          0644: the job attaches it read-only
  usage   written by the hook with atomics; owned by the job's user, mode
          0600; the daemon attaches it read-only
  signal  written by the hook (when the job last launched, until when its
          work should keep the GPU): owned by the job's user, mode 0644; the
          hooks of jobs of a lower class on its GPU attach it read-only,
          the daemon reads its launch counts (vgpuctl.system.priority)

Why segments and not files: a segment has the size it was created with for
good. The job's user can write its usage, not truncate it, grow it, or fill
a filesystem through it, and the daemon allocates and touches every page
before anyone attaches, so no access through an attachment can fault for
want of space (a file mapped from a filesystem that someone filled raises
SIGBUS at the first store into a page it never had). The kernel records
who created a segment (``shm_perm.cuid``), which no one else can set: the
hook uses only segments the daemon's user created. Nothing of a region is
a file a job's user can write.

The usage is still the job's to write with anything: the daemon copies it
into its own memory and validates what it got: a wrong magic or a counter
out of any physically possible range raises `BadRegion`, which is that
job's problem (the daemon flags it and closes its gate), never the
daemon's. See docs/security.md, "The usage region".
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vgpuctl.system.limits import DeviceLimit, RegionLimits
from vgpuctl.system.shm import shm_attach, shm_create, shm_detach, shm_remove, shm_stat
from vgpuctl.system.structs import const, ffi, sizes

REGION_FILE = "region"
REGION_TAG = "vgpu-region"
# The daemon's checkpoint of the hook's counters (owner-only: the daemon's).
CHECKPOINT_FILE = "checkpoint"

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
class DeviceUsage:
    used: int
    peak: int
    launches: int
    throttled_ns: int
    oom_refusals: int
    busy_ns: int = 0            # GPU time the job's hooks measured (job-written)
    cost_ns: int = 0            # one launch's, as last measured
    borrowed_ns: int = 0        # part of busy_ns run in open spans


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


def read_ids(path: Path) -> tuple[int, int, int]:
    """The (limits, usage, signal) segment ids a job directory's region file
    names; ValueError when it names none (OSError when it can't be read)."""
    fd = os.open(path / REGION_FILE, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        text = os.read(fd, 128).decode("ascii", "replace")
    finally:
        os.close(fd)
    m = re.fullmatch(rf"{REGION_TAG} (\d+) (\d+) (\d+) (\d+)\n?", text)
    if m is None:
        raise ValueError(f"{path}: not a vgpu region")
    if int(m.group(1)) != const("VGPU_REGION_VERSION"):
        raise ValueError(f"{path}: region layout version {m.group(1)}, expected "
                         f"{const('VGPU_REGION_VERSION')}")
    return int(m.group(2)), int(m.group(3)), int(m.group(4))


def _any_ids(path: Path) -> list[int]:
    """The segment ids a region file of any layout names (a region of an
    earlier layout, left by a daemon before an upgrade); none when there is
    no such file."""
    try:
        fd = os.open(path / REGION_FILE, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return []
    try:
        text = os.read(fd, 128).decode("ascii", "replace")
    finally:
        os.close(fd)
    m = re.fullmatch(rf"{REGION_TAG} \d+((?: \d+)+)\n?", text)
    return [int(x) for x in m.group(1).split()] if m else []


def _own_segment(sid: int, size: int) -> bool:
    """Whether segment sid exists, was made by this process's user and holds
    size bytes or more: one of our regions' (a stale id may name another's)."""
    try:
        ds = shm_stat(sid)
    except OSError:
        return False
    return ds.perm.cuid == os.geteuid() and ds.segsz >= size


class Region(RegionLimits):
    """One job's region. Create with Region.create (daemon), or open an
    existing one with Region.open."""

    def __init__(self, path: Path, ids: tuple[int, int, int], limits_addr: int,
                 usage_addr: int | None, usage_writable: bool = False,
                 limits_writable: bool = False, signal_addr: int | None = None) -> None:
        f = ffi()
        self.path = path
        self._lwritable = limits_writable
        self.limits_id, self.usage_id, self.signal_id = ids
        self._laddr: int | None = limits_addr
        self._uaddr = usage_addr
        self._uwritable = usage_writable
        self._saddr = signal_addr
        self.limits = f.cast("struct vgpu_limits *", limits_addr)

    @property
    def usage_readable(self) -> bool:
        return self._uaddr is not None

    # -- creation and opening ------------------------------------------------
    @classmethod
    def create(cls, path: Path | str, job_id: str, owner_uid: int,
               devices: list[DeviceLimit]) -> Region:
        """Make the job's three segments (every page allocated), fill them, and
        name them in the directory's region file (written under a temporary
        name, then renamed): the region, its limits writable. OSError when a
        segment or the file can't be made (no space): nothing is left."""
        f = ffi()
        path = Path(path)
        max_dev = const("VGPU_MAX_DEVICES")
        if len(devices) > max_dev:
            raise ValueError(f"at most {max_dev} devices per job")
        lsize, usize, ssize = sizes()
        made: list[int] = []
        reg: Region | None = None
        try:
            path.mkdir(parents=True, exist_ok=True)
            lid = shm_create(lsize, None, 0o644)
            made.append(lid)
            owner = owner_uid if os.geteuid() == 0 else None
            uid = shm_create(usize, owner, 0o600)
            made.append(uid)
            sid = shm_create(ssize, owner, 0o644)
            made.append(sid)
            for seg, struct, magic in ((uid, "struct vgpu_usage *", "VGPU_REGION_MAGIC"),
                                       (sid, "struct vgpu_signal *", "VGPU_SIGNAL_MAGIC")):
                addr = shm_attach(seg, writable=True)
                try:
                    head = f.cast(struct, addr)
                    head.version = const("VGPU_REGION_VERSION")
                    head.magic = const(magic)
                finally:
                    shm_detach(addr)
            reg = cls(path, (lid, uid, sid), shm_attach(lid, writable=True),
                      shm_attach(uid, writable=False), limits_writable=True,
                      signal_addr=shm_attach(sid, writable=False))
            lim = reg.limits
            lim.version = const("VGPU_REGION_VERSION")
            jid = job_id.encode()[: const("VGPU_JOB_ID_LEN") - 1]
            f.memmove(lim.job_id, jid, len(jid))
            lim.owner_uid = owner_uid
            reg.set_devices(devices)
            lim.magic = const("VGPU_REGION_MAGIC")
            tmp = path / f".{REGION_FILE}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o644)
            try:
                text = (f"{REGION_TAG} {const('VGPU_REGION_VERSION')} {lid} {uid} "
                        f"{sid}\n").encode()
                if os.write(fd, text) != len(text):
                    raise OSError(errno.ENOSPC, "short write")
                os.fchmod(fd, 0o644)
            finally:
                os.close(fd)
            os.rename(tmp, path / REGION_FILE)
        except BaseException:
            if reg is not None:
                reg.close()
            for sid in made:
                shm_remove(sid)
            try:
                os.unlink(path / f".{REGION_FILE}.tmp")
            except OSError:
                pass
            raise
        return reg

    @classmethod
    def open(cls, path: Path | str, writable_limits: bool = False,
             writable_usage: bool = False) -> Region:
        """The region of a job directory. Its usage and signal are attached
        read-only (writable_usage: read-write, as the job's user may: for
        tests), or not at all where this user may not (usage_readable is
        then False). OSError or ValueError when it is not a region (any
        more)."""
        f = ffi()
        path = Path(path)
        lid, uid, sid = read_ids(path)
        ds = shm_stat(lid)
        if ds.segsz < f.sizeof("struct vgpu_limits"):
            raise ValueError(f"{path}: the limits segment {lid} is too small")
        laddr = shm_attach(lid, writable=writable_limits)
        try:
            uaddr: int | None = shm_attach(uid, writable=writable_usage)
            if shm_stat(uid).segsz < f.sizeof("struct vgpu_usage"):
                shm_detach(uaddr)
                raise ValueError(f"{path}: the usage segment {uid} is too small")
        except PermissionError:
            uaddr = None
        except BaseException:
            shm_detach(laddr)
            raise
        saddr: int | None = None
        try:
            if shm_stat(sid).segsz == f.sizeof("struct vgpu_signal"):
                saddr = shm_attach(sid, writable=writable_usage)
        except OSError:
            saddr = None
        reg = cls(path, (lid, uid, sid), laddr, uaddr, writable_usage, writable_limits,
                  signal_addr=saddr)
        try:
            if reg.limits.magic != const("VGPU_REGION_MAGIC"):
                raise ValueError(f"{path}: not a vgpu region")
            if reg.limits.version != const("VGPU_REGION_VERSION"):
                raise ValueError(f"{path}: region layout version {reg.limits.version}, "
                                 f"expected {const('VGPU_REGION_VERSION')}")
        except BaseException:
            reg.close()
            raise
        return reg

    @staticmethod
    def discard(path: Path | str) -> None:
        """Remove what a job directory holds (its segments, when this user
        made them, and its files), the region open or not."""
        path = Path(path)
        try:
            named = list(zip(read_ids(path), sizes(), strict=True))
        except (OSError, ValueError):
            named = [(sid, 1) for sid in _any_ids(path)]
        for sid, size in named:
            if _own_segment(sid, size):
                shm_remove(sid)
        import shutil

        shutil.rmtree(path, ignore_errors=True)

    # -- usage (written by the hook: untrusted) ---------------------------------
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
                    allocs=_count(s.allocs), get_proc_calls=_count(s.get_proc_calls),
                    features=int(s.features),
                    busy_ns=[_count(s.busy_ns[j]) for j in range(n)]))
        return Usage(devs, procs)

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

    # -- the daemon's checkpoint -------------------------------------------------
    def write_checkpoint(self, data: dict[str, Any]) -> None:
        """Keep ``data`` (JSON) beside the region, in the daemon's own file
        (the job's user can't write the directory), replaced atomically."""
        tmp = self.path / f".{CHECKPOINT_FILE}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            try:
                os.write(fd, json.dumps(data, separators=(",", ":")).encode())
            finally:
                os.close(fd)
            os.rename(tmp, self.path / CHECKPOINT_FILE)
        except OSError:
            try:                # (a full disk, the directory gone): nothing left behind
                os.unlink(tmp)
            except OSError:
                pass
            raise

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
        """Detach the segments (they stay: the job's processes use them)."""
        self.limits = None
        for attr in ("_laddr", "_uaddr", "_saddr"):
            addr = getattr(self, attr)
            if addr is not None:
                shm_detach(addr)
                setattr(self, attr, None)

    def remove(self) -> None:
        """Delete the region: its segments (gone once the last process that
        uses them detaches), its files and its directory."""
        self.close()
        shm_remove(self.limits_id)
        shm_remove(self.usage_id)
        shm_remove(self.signal_id)
        for name in (REGION_FILE, CHECKPOINT_FILE, f".{REGION_FILE}.tmp",
                     f".{CHECKPOINT_FILE}.tmp"):
            try:
                os.unlink(self.path / name)
            except FileNotFoundError:
                pass
        try:
            os.rmdir(self.path)
        except OSError:
            pass
