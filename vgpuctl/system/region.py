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
          the daemon reads its launch counts (vgpuctl.system.class_fields)

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

The parts: vgpuctl.system.shm (the segments, through libc),
vgpuctl.system.structs (region.h through cffi), vgpuctl.system.limits (the
limits, the daemon's to write) and vgpuctl.system.usage (the usage and the
signal, the job's: copied, then validated). Here: the job directory's
files, and a region made, opened, closed and removed whole.
"""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path
from typing import Any

from vgpuctl.system.limits import DeviceLimit, RegionLimits
from vgpuctl.system.shm import shm_attach, shm_create, shm_detach, shm_remove, shm_stat
from vgpuctl.system.structs import const, ffi, sizes
from vgpuctl.system.usage import MAX_BYTES, BadRegion, RegionUsage

# What vgpuctl.daemon imports from here (DeviceLimit, MAX_BYTES and BadRegion
# live in vgpuctl.system.limits and vgpuctl.system.usage).
__all__ = ["MAX_BYTES", "BadRegion", "DeviceLimit", "Region"]

REGION_FILE = "region"
REGION_TAG = "vgpu-region"
# The daemon's checkpoint of the hook's counters (owner-only: the daemon's).
CHECKPOINT_FILE = "checkpoint"


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


class Region(RegionLimits, RegionUsage):
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
