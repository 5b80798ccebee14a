"""The simulated GPU's shared state, as `vgpuctl sim` sees and steers it.

The state file's layout is private to the simulator (libvgpu/sim): its own
libraries export control functions (``vgpu_sim_ctl_*``) that read and change
it under the state's lock, after giving back the memory of dead processes,
exactly as the simulated driver does. This module calls them through ctypes
and turns their JSON into dataclasses. The file is the one ``VGPU_SIM_STATE``
names (default ``/dev/shm/vgpu-sim-<uid>``), read when the library first
touches it.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vgpuctl.errors import SimError, UsageError
from vgpuctl.system import native


@dataclass(frozen=True)
class DeviceStats:
    index: int
    uuid: str
    total: int
    used: int
    busy_ns: int
    kernels: int
    fail_allocs: int
    switches: int = 0       # context switches on its timeline


@dataclass(frozen=True)
class MigDeviceStats:
    """A GPU instance of a GPU in MIG mode, and its MIG device (its compute
    instance: ci 0 and its MIG- UUID, or None before one is created)."""

    slot: int               # its device slot: the index of processes' mig_devices rows
    parent: int             # the GPU it is on
    gi: int                 # GPU instance id
    ci: int | None
    uuid: str | None
    profile: str            # "1g.10gb"
    start: int              # placement: first memory slice
    total: int
    used: int
    busy_ns: int
    kernels: int


@dataclass(frozen=True)
class DeviceShare:
    """One process's or tag's share of one device."""

    index: int
    used: int
    peak: int
    busy_ns: int
    contexts: int = 0
    queued_ns: int = 0      # a process's kernel time submitted and not yet run
    held: int = 0      # a checkpointed process: what it held here, now in host memory


@dataclass(frozen=True)
class ProcessStats:
    pid: int
    tag: str | None
    devices: list[DeviceShare]
    checkpoint: str = "running"   # its state for the checkpoint API
    mig_devices: list[DeviceShare] = field(default_factory=list)  # index: MigDeviceStats.slot


@dataclass(frozen=True)
class TagStats:
    name: str
    devices: list[DeviceShare]
    mig_devices: list[DeviceShare] = field(default_factory=list)  # index: MigDeviceStats.slot


@dataclass(frozen=True)
class SimStats:
    path: str
    count: int
    memory: int
    sample_ms: int
    nvml_error: int
    nvml_error_count: int
    devices: list[DeviceStats]
    processes: list[ProcessStats]
    tags: list[TagStats]
    util_idle: str = "average"  # VGPU_SIM_UTIL_IDLE: idle periods averaged in or skipped
    util_procs: str = "last"    # VGPU_SIM_UTIL_PROCS: which processes a period names
                                # (last, busiest, each; none: not supported)
    timeslice_us: int = 0       # VGPU_SIM_TIMESLICE_US: time slice between processes
    switch_us: int = 0          # VGPU_SIM_SWITCH_US: what a switch costs
    ckpt_rate: int = 0          # VGPU_SIM_CKPT_RATE: checkpoint copies, bytes/s
    ckpt_pairs: str = "checkpointed"   # VGPU_SIM_CKPT_PAIRS
    ckpt_refused: str = "failed"       # VGPU_SIM_CKPT_REFUSED
    mig_mode: list[int] = field(default_factory=list)   # per GPU: 1 in MIG mode
    mig_devices: list[MigDeviceStats] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def _usage(rows: list[dict[str, Any]]) -> list[DeviceShare]:
    return [DeviceShare(r["index"], r["used"], r["peak"], r["busy_ns"], r.get("contexts", 0),
                        r.get("queued_ns", 0), r.get("held", 0))
            for r in rows]


def parse_stats(text: str) -> SimStats:
    """SimStats from the JSON vgpu_sim_ctl_stats writes."""
    d = json.loads(text)
    return SimStats(
        path=d["path"], count=d["count"], memory=d["memory"], sample_ms=d["sample_ms"],
        nvml_error=d["faults"]["nvml_error"], nvml_error_count=d["faults"]["nvml_error_count"],
        devices=[DeviceStats(**dev) for dev in d["devices"]],
        processes=[ProcessStats(p["pid"], p["tag"], _usage(p["devices"]),
                                p.get("checkpoint", "running"), _usage(p.get("mig_devices", [])))
                   for p in d["processes"]],
        tags=[TagStats(t["name"], _usage(t["devices"]), _usage(t.get("mig_devices", [])))
              for t in d["tags"]],
        util_idle=d.get("util_idle", "average"),
        util_procs=d.get("util_procs", "each"),
        timeslice_us=d.get("timeslice_us", 0), switch_us=d.get("switch_us", 0),
        ckpt_rate=d.get("checkpoint", {}).get("rate", 0),
        ckpt_pairs=d.get("checkpoint", {}).get("pairs", "checkpointed"),
        ckpt_refused=d.get("checkpoint", {}).get("refused", "failed"),
        mig_mode=d.get("mig_mode", []),
        mig_devices=[MigDeviceStats(**m) for m in d.get("mig_devices", [])],
    )


def nvml_error_code(text: str) -> int:
    """An NVML return code from its number or name (GPU_IS_LOST,
    NVML_ERROR_GPU_IS_LOST, 15)."""
    t = text.strip()
    if t.isdigit():
        code = int(t)
    else:
        import pynvml

        name = t.upper()
        if not name.startswith("NVML_ERROR_"):
            name = "NVML_ERROR_" + name
        code = getattr(pynvml, name, 0)
        if not isinstance(code, int) or not code:
            raise UsageError(f"--nvml-error {text!r}: not an NVML error (try GPU_IS_LOST or 15)")
    if code <= 0:
        raise UsageError(f"--nvml-error {text!r}: an error code is a positive number")
    return code


# A daemon that reads the state holds a read lock (open file description
# lock) on this byte, past the simulator's own slot locks (2^40 + slot):
# `vgpuctl sim reset` refuses while one is held. Locks past the end of a
# file are allowed and change nothing in it.
DAEMON_LOCK_BYTE = 1 << 41


def state_path() -> str:
    """The state file, as the simulator names it."""
    return os.environ.get("VGPU_SIM_STATE") or f"/dev/shm/vgpu-sim-{os.getuid()}"


def _flock(kind: int) -> bytes:
    # struct flock on Linux: short l_type, l_whence; off_t l_start, l_len; pid_t l_pid.
    return struct.pack("hhqqi4x", kind, os.SEEK_SET, DAEMON_LOCK_BYTE, 1, 0)


class DaemonMark:
    """The daemon's mark on the state it reads (see DAEMON_LOCK_BYTE), and
    the check that the file it marked is still the one the path names."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or state_path()
        self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        fcntl.fcntl(self.fd, fcntl.F_OFD_SETLK, _flock(fcntl.F_RDLCK))

    def replaced(self) -> bool:
        """The state file was removed or replaced since the mark was set."""
        try:
            return os.stat(self.path).st_ino != os.fstat(self.fd).st_ino
        except OSError:
            return True

    def close(self) -> None:
        os.close(self.fd)


def daemon_uses(path: str | None = None) -> bool:
    """Whether a daemon holds its mark on the state file."""
    try:
        fd = os.open(path or state_path(), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        got = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _flock(fcntl.F_WRLCK))
        return struct.unpack("hhqqi4x", got)[0] != fcntl.F_UNLCK
    except OSError:
        return False
    finally:
        os.close(fd)


class SimState:
    """The control functions of the simulator's NVML library."""

    def __init__(self, libdir: Path | None = None) -> None:
        lib = (libdir or native.sim_libdir()) / "libnvidia-ml.so.1"
        try:
            self._lib = ctypes.CDLL(str(lib))
        except OSError as e:
            raise SimError(f"cannot load {lib}: {e}") from None
        f = self._lib
        f.vgpu_sim_ctl_stats.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        f.vgpu_sim_ctl_fail_allocs.argtypes = [ctypes.c_int, ctypes.c_longlong]
        f.vgpu_sim_ctl_nvml_error.argtypes = [ctypes.c_int, ctypes.c_longlong]
        f.vgpu_sim_ctl_clear_faults.argtypes = []
        f.vgpu_sim_ctl_reset.argtypes = [ctypes.c_int]

    def stats(self) -> SimStats | None:
        """The state now; None if there is no state file yet."""
        size = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(size)
            n = self._lib.vgpu_sim_ctl_stats(buf, size)
            if n < 0:
                return None
            if n < size:
                return parse_stats(buf.value.decode())
            size = n + 1

    def fail_allocs(self, count: int, gpu: int = 0) -> None:
        """Make the next `count` device allocations on `gpu`, from any
        process, fail with CUDA_ERROR_OUT_OF_MEMORY."""
        if count < 0:
            raise UsageError("--fail-allocs needs a count >= 0")
        if self._lib.vgpu_sim_ctl_fail_allocs(gpu, count) < 0:
            raise UsageError(f"--gpu {gpu}: no such simulated GPU")

    def nvml_error(self, code: int, count: int = 1) -> None:
        """Make the next `count` NVML calls (-1: every call until cleared)
        return `code`."""
        if self._lib.vgpu_sim_ctl_nvml_error(code, count) < 0:
            raise SimError("the simulated GPU's state is unavailable")

    def clear_faults(self) -> None:
        if self._lib.vgpu_sim_ctl_clear_faults() < 0:
            raise SimError("the simulated GPU's state is unavailable")

    def reset(self, force: bool = False) -> int:
        """Delete the state file. Returns 0, or, when live processes use it
        and not `force`, how many (and leaves it). Refused (SimError), even
        with `force`, while a daemon reads it: the daemon would go on
        reading the deleted file and see nothing of the new one."""
        if daemon_uses():
            raise SimError(f"a vgpuctl daemon uses the simulated GPU's state {state_path()}: "
                           "stop it first (a reset would leave it blind)")
        rc = self._lib.vgpu_sim_ctl_reset(1 if force else 0)
        if rc < 0:
            raise SimError("the simulated GPU's state is unavailable")
        return int(rc)
