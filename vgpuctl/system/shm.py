"""System V shared memory, through libc: the segments a job's region lives
in (vgpuctl.system.region). A segment has the size it was created with for
good, and the kernel records who created it (``shm_perm.cuid``), which no
one else can set."""

from __future__ import annotations

import ctypes
import errno
import os
from typing import Any

IPC_PRIVATE = 0
IPC_CREAT = 0o1000
IPC_EXCL = 0o2000
IPC_RMID = 0
IPC_SET = 1
IPC_STAT = 2
SHM_RDONLY = 0o10000


class IpcPerm(ctypes.Structure):
    """struct ipc_perm on 64-bit Linux (x86_64 and aarch64 lay it out alike;
    tests/hook/test_region_segments.py checks it against the C headers)."""
    _fields_ = [("key", ctypes.c_int32), ("uid", ctypes.c_uint32), ("gid", ctypes.c_uint32),
                ("cuid", ctypes.c_uint32), ("cgid", ctypes.c_uint32),
                ("mode", ctypes.c_uint32),           # a 16-bit mode and its padding
                ("seq", ctypes.c_uint16), ("pad2", ctypes.c_uint16),
                ("reserved1", ctypes.c_ulong), ("reserved2", ctypes.c_ulong)]


class ShmidDs(ctypes.Structure):
    """struct shmid_ds on 64-bit Linux."""
    _fields_ = [("perm", IpcPerm), ("segsz", ctypes.c_size_t), ("atime", ctypes.c_long),
                ("dtime", ctypes.c_long), ("ctime", ctypes.c_long),
                ("cpid", ctypes.c_int32), ("lpid", ctypes.c_int32),
                ("nattch", ctypes.c_ulong), ("reserved4", ctypes.c_ulong),
                ("reserved5", ctypes.c_ulong)]


_libc: Any = None


def _lib() -> Any:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
        lib.shmget.restype = ctypes.c_int
        lib.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        lib.shmat.restype = ctypes.c_void_p
        lib.shmdt.argtypes = [ctypes.c_void_p]
        lib.shmdt.restype = ctypes.c_int
        lib.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ShmidDs)]
        lib.shmctl.restype = ctypes.c_int
        _libc = lib
    return _libc


def _oserror(what: str) -> OSError:
    e = ctypes.get_errno()
    return OSError(e, f"{what}: {os.strerror(e)}")


def shm_create(size: int, owner_uid: int | None, mode: int) -> int:
    """A new private segment of size bytes, every page allocated and zero;
    its owner set to owner_uid (None: ours) and its mode to mode. OSError
    (ENOSPC: the kernel's segment limit, ENOMEM) when it can't be made."""
    lib = _lib()
    sid = lib.shmget(IPC_PRIVATE, size, IPC_CREAT | IPC_EXCL | 0o600)
    if sid < 0:
        e = ctypes.get_errno()
        if e == errno.ENOSPC:
            raise OSError(e, f"no System V shared memory segment left to make ({_holders()})")
        raise _oserror("shmget")
    try:
        ds = shm_stat(sid)
        if owner_uid is not None:
            ds.perm.uid = owner_uid
        ds.perm.mode = mode
        if lib.shmctl(sid, IPC_SET, ctypes.byref(ds)) != 0:
            raise _oserror("shmctl(IPC_SET)")
        addr = shm_attach(sid, writable=True)
        try:
            ctypes.memset(addr, 0, size)     # every page allocated now, not at a store
        finally:
            lib.shmdt(ctypes.c_void_p(addr))
    except BaseException:
        shm_remove(sid)
        raise
    return sid


def _holders() -> str:
    """Who made the node's System V segments: the kernel's limit, and the
    user who created the most (one user can make them all, and none is
    left for the daemon: the operator should know whom to ask). By creator
    (cuid), which no one can change: a segment's owner (uid) its creator
    may set to another user, to blame them."""
    count: dict[int, int] = {}
    try:
        with open("/proc/sysvipc/shm") as f:
            next(f)
            for line in f:
                col = line.split()
                count[int(col[9])] = count.get(int(col[9]), 0) + 1      # cuid
        with open("/proc/sys/kernel/shmmni") as f:
            limit = f.read().strip()
    except (OSError, ValueError, IndexError, StopIteration):
        return "kernel.shmmni"
    if not count:
        return f"kernel.shmmni is {limit}"
    uid, n = max(count.items(), key=lambda kv: kv[1])
    try:
        import pwd

        who = pwd.getpwuid(uid).pw_name
    except KeyError:
        who = f"uid {uid}"
    return f"kernel.shmmni is {limit}; {who} made {n} of the {sum(count.values())} there are"


def shm_stat(sid: int) -> ShmidDs:
    ds = ShmidDs()
    if _lib().shmctl(sid, IPC_STAT, ctypes.byref(ds)) != 0:
        raise _oserror(f"segment {sid}")
    return ds


def shm_attach(sid: int, writable: bool) -> int:
    addr = _lib().shmat(sid, None, 0 if writable else SHM_RDONLY)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        raise _oserror(f"segment {sid}")
    return int(addr)


def shm_detach(addr: int) -> None:
    _lib().shmdt(ctypes.c_void_p(addr))


def shm_remove(sid: int) -> None:
    """Mark a segment for removal (it goes when the last process detaches);
    nothing when it is already gone or not ours to remove."""
    _lib().shmctl(sid, IPC_RMID, None)
