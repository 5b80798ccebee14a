"""The driver's checkpoint API, through libcuda.so.1 (ctypes, after cuInit):
lock a process's CUDA calls, checkpoint its device memory to host memory,
restore it (onto the same GPU or another one), unlock it. The controlling
process is this one; the processes are a job's.

Versions (docs/suspend.md): the API came with driver R570 (CUDA 12.8); a
restore onto another GPU (UUID pairs) with R580 (CUDA 13.0).
`cuDriverGetVersion` says which CUDA the driver supports, and the entry
points are fetched with `cuGetProcAddress` for CUDA 12.8, as NVIDIA's
runtime fetches them (an older driver does not know them). What this
driver can't do is one line naming the version it needs
(`CheckpointUnavailable`), never a crash.

Each call may block: a lock waits for the process's work (up to its
timeout), a checkpoint or a restore copies the process's memory. The
daemon calls them from a worker thread.
"""

from __future__ import annotations

import ctypes
import threading
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass

from vgpuctl.errors import CheckpointError, CheckpointUnavailable

SUSPEND_CUDA = 12080    # CUDA 12.8: driver R570
MOVE_CUDA = 13000       # CUDA 13.0: driver R580
SUSPEND_DRIVER = "R570"
MOVE_DRIVER = "R580"

# CUresult values the daemon tells apart (cuda.h)
CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_OPERATING_SYSTEM = 304
CUDA_ERROR_ILLEGAL_STATE = 401
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_NOT_PERMITTED = 800
CUDA_ERROR_NOT_SUPPORTED = 801

NAMES = {
    CUDA_SUCCESS: "CUDA_SUCCESS", CUDA_ERROR_INVALID_VALUE: "CUDA_ERROR_INVALID_VALUE",
    CUDA_ERROR_OUT_OF_MEMORY: "CUDA_ERROR_OUT_OF_MEMORY",
    CUDA_ERROR_NOT_INITIALIZED: "CUDA_ERROR_NOT_INITIALIZED",
    CUDA_ERROR_OPERATING_SYSTEM: "CUDA_ERROR_OPERATING_SYSTEM",
    CUDA_ERROR_ILLEGAL_STATE: "CUDA_ERROR_ILLEGAL_STATE",
    CUDA_ERROR_NOT_FOUND: "CUDA_ERROR_NOT_FOUND", CUDA_ERROR_NOT_READY: "CUDA_ERROR_NOT_READY",
    CUDA_ERROR_NOT_PERMITTED: "CUDA_ERROR_NOT_PERMITTED",
    CUDA_ERROR_NOT_SUPPORTED: "CUDA_ERROR_NOT_SUPPORTED",
}

# What GetState answers for a process that is no CUDA process (one that
# never initialised CUDA, or is gone): INVALID_VALUE as documented; some
# drivers say NOT_FOUND or NOT_INITIALIZED.
NOT_CUDA = (CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_INITIALIZED)

# CUprocessState
STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}


class _LockArgs(ctypes.Structure):
    _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint),
                ("reserved1", ctypes.c_uint64 * 7)]


class _Reserved(ctypes.Structure):          # checkpoint and unlock arguments
    _fields_ = [("reserved", ctypes.c_uint64 * 8)]


class _GpuPair(ctypes.Structure):
    _fields_ = [("oldUuid", ctypes.c_char * 16), ("newUuid", ctypes.c_char * 16)]


class _RestoreArgs(ctypes.Structure):       # 64 bytes, as cuda.h 13.0 lays it out
    _fields_ = [("gpuPairs", ctypes.POINTER(_GpuPair)), ("gpuPairsCount", ctypes.c_uint),
                ("reserved", ctypes.c_char * 44), ("reserved1", ctypes.c_uint64)]


def error_name(rc: int) -> str:
    return NAMES.get(rc, f"CUresult {rc}")


def cuda_text(version: int) -> str:
    """13000 -> "CUDA 13.0"."""
    return f"CUDA {version // 1000}.{version % 1000 // 10}"


def uuid_bytes(text: str) -> bytes:
    """The 16 bytes of a GPU UUID written "GPU-xxxxxxxx-..." (or a MIG
    device's, "MIG-..."). ValueError otherwise."""
    t = text.strip()
    if t.upper().startswith(("GPU-", "MIG-")):
        t = t[4:]
    return uuidlib.UUID(t).bytes


@dataclass(frozen=True)
class Availability:
    """What this node's driver offers: suspend (R570) and move (R580)."""
    cuda: int | None            # cuDriverGetVersion; None: no driver could be asked
    suspend: bool
    move: bool
    why: str | None = None      # why suspend is not offered (one line)
    why_move: str | None = None


class Driver:
    """The checkpoint API of the driver this process loaded. Thread-safe: one
    call at a time."""

    _FUNCS = {
        "cuCheckpointProcessGetState": [ctypes.c_int, ctypes.POINTER(ctypes.c_int)],
        "cuCheckpointProcessLock": [ctypes.c_int, ctypes.POINTER(_LockArgs)],
        "cuCheckpointProcessCheckpoint": [ctypes.c_int, ctypes.POINTER(_Reserved)],
        "cuCheckpointProcessRestore": [ctypes.c_int, ctypes.POINTER(_RestoreArgs)],
        "cuCheckpointProcessUnlock": [ctypes.c_int, ctypes.POINTER(_Reserved)],
    }

    def __init__(self, lib: ctypes.CDLL, cuda: int) -> None:
        self.cuda = cuda
        self._lock = threading.Lock()
        self._fn: dict[str, ctypes._CFuncPtr] = {}     # type: ignore[name-defined]
        for name, argtypes in self._FUNCS.items():
            ptr = _proc_address(lib, name)
            if ptr is None:
                raise CheckpointUnavailable(
                    f"suspend needs NVIDIA driver {SUSPEND_DRIVER} or newer "
                    f"({cuda_text(SUSPEND_CUDA)}); this driver ({cuda_text(cuda)}) has no "
                    f"{name}")
            self._fn[name] = ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(ptr)

    @classmethod
    def open(cls, library: str = "libcuda.so.1") -> Driver:
        """The driver's checkpoint API; CheckpointUnavailable (one line)
        when there is no driver, or one older than R570."""
        try:
            lib = ctypes.CDLL(library)
        except OSError as e:
            raise CheckpointUnavailable(f"suspend needs the NVIDIA driver's {library}, which "
                                        f"can't be loaded here: {e}") from None
        rc = lib.cuInit(0)
        if rc != CUDA_SUCCESS:
            raise CheckpointUnavailable(f"suspend needs a working NVIDIA driver: cuInit "
                                        f"failed ({error_name(rc)})")
        v = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(v)) != CUDA_SUCCESS:
            raise CheckpointUnavailable("suspend needs a working NVIDIA driver: "
                                        "cuDriverGetVersion failed")
        if v.value < SUSPEND_CUDA:
            raise CheckpointUnavailable(
                f"suspend needs NVIDIA driver {SUSPEND_DRIVER} or newer "
                f"({cuda_text(SUSPEND_CUDA)}); this driver supports {cuda_text(v.value)}")
        return cls(lib, v.value)

    @property
    def can_move(self) -> bool:
        return self.cuda >= MOVE_CUDA

    def check_move(self) -> None:
        """CheckpointUnavailable (one line) when a restore can't change GPUs."""
        if not self.can_move:
            raise CheckpointUnavailable(
                f"moving a job to another GPU needs NVIDIA driver {MOVE_DRIVER} or newer "
                f"({cuda_text(MOVE_CUDA)}); this driver supports {cuda_text(self.cuda)}")

    # -- the calls ---------------------------------------------------------------
    def _call(self, name: str, *args: object) -> int:
        with self._lock:
            return int(self._fn[name](*args))

    def state(self, pid: int) -> str | None:
        """The process's state ("running", "locked", "checkpointed",
        "failed"), or None when it is no CUDA process (or is gone)."""
        st = ctypes.c_int(-1)
        rc = self._call("cuCheckpointProcessGetState", pid, ctypes.byref(st))
        if rc in NOT_CUDA:
            return None
        if rc != CUDA_SUCCESS:
            raise CheckpointError(f"process {pid}: cuCheckpointProcessGetState failed "
                                  f"({error_name(rc)})", rc)
        return STATES.get(st.value, f"state {st.value}")

    def lock(self, pid: int, timeout_ms: int) -> None:
        args = _LockArgs(timeoutMs=max(0, int(timeout_ms)))
        self._check("lock", pid, self._call("cuCheckpointProcessLock", pid,
                                            ctypes.byref(args)))

    def checkpoint(self, pid: int) -> None:
        self._check("checkpoint", pid, self._call("cuCheckpointProcessCheckpoint", pid,
                                                  ctypes.byref(_Reserved())))

    def restore(self, pid: int, pairs: Sequence[tuple[str, str]] = ()) -> None:
        """Restore onto the same GPUs, or with (old UUID, new UUID) pairs."""
        args = _RestoreArgs()
        keep = None
        if pairs:
            self.check_move()
            keep = (_GpuPair * len(pairs))()
            for i, (old, new) in enumerate(pairs):
                keep[i].oldUuid = uuid_bytes(old)
                keep[i].newUuid = uuid_bytes(new)
            args.gpuPairs = ctypes.cast(keep, ctypes.POINTER(_GpuPair))
            args.gpuPairsCount = len(pairs)
        self._check("restore", pid, self._call("cuCheckpointProcessRestore", pid,
                                               ctypes.byref(args)))

    def unlock(self, pid: int) -> None:
        self._check("unlock", pid, self._call("cuCheckpointProcessUnlock", pid,
                                              ctypes.byref(_Reserved())))

    @staticmethod
    def _check(what: str, pid: int, rc: int) -> None:
        if rc != CUDA_SUCCESS:
            raise CheckpointError(f"process {pid}: {what} failed ({error_name(rc)})", rc)


def _proc_address(lib: ctypes.CDLL, name: str) -> int | None:
    """The entry point as a runtime fetches it: cuGetProcAddress_v2 for
    CUDA 12.8 (cuGetProcAddress before CUDA 12.0); None when the driver
    does not have it."""
    fn = ctypes.c_void_p()
    status = ctypes.c_int(0)
    try:
        gpa = lib.cuGetProcAddress_v2
        rc = gpa(name.encode(), ctypes.byref(fn), SUSPEND_CUDA, ctypes.c_uint64(0),
                 ctypes.byref(status))
    except AttributeError:
        try:
            rc = lib.cuGetProcAddress(name.encode(), ctypes.byref(fn), SUSPEND_CUDA,
                                      ctypes.c_uint64(0))
        except AttributeError:
            return None
    return fn.value if rc == CUDA_SUCCESS and fn.value else None


def availability(library: str = "libcuda.so.1") -> Availability:
    """What suspend and move need, and whether this node's driver has it
    (for `vgpuctl doctor`)."""
    try:
        d = Driver.open(library)
    except CheckpointUnavailable as e:
        cuda = _cuda_version(library)
        return Availability(cuda, False, False, str(e),
                            f"moving needs NVIDIA driver {MOVE_DRIVER} or newer "
                            f"({cuda_text(MOVE_CUDA)})")
    why_move = None
    if not d.can_move:
        why_move = (f"moving a job to another GPU needs NVIDIA driver {MOVE_DRIVER} or newer "
                    f"({cuda_text(MOVE_CUDA)}); this driver supports {cuda_text(d.cuda)}")
    return Availability(d.cuda, True, d.can_move, None, why_move)


def _cuda_version(library: str) -> int | None:
    try:
        lib = ctypes.CDLL(library)
        v = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(v)) == CUDA_SUCCESS:
            return v.value
    except OSError:
        pass
    return None
