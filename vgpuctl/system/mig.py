"""MIG through NVML: a GPU's profiles and placements, its GPU instances,
and making and destroying them (docs/mig.md).

Every function takes the initialised pynvml module (``Nvml().module``) and
a GPU's NVML index. A MIG device vgpuctl makes is one GPU instance with one
compute instance of the whole of it, as ``nvidia-smi mig -cgi PROFILE -C``
makes it. NVML's refusals become one-line errors that say what to do.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vgpuctl.core import placement
from vgpuctl.errors import AdmissionRefused, NotFound, PermissionDenied, UsageError, VgpuError
from vgpuctl.system.nvml import GpuStats, nvml_text

# NVML's return codes that mean something here
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_INVALID_ARGUMENT = 2
_NOT_FOUND = 6
_INSUFFICIENT_RESOURCES = 23
_IN_USE = 19

PROFILE_IDS = range(0, 0x12)        # NVML_GPU_INSTANCE_PROFILE_1_SLICE .. _COUNT
_CI_PROFILE_IDS = range(0, 0x9)     # NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE .. _COUNT
_MAX_INSTANCES = 16


@dataclass(frozen=True)
class Profile:
    """A GPU instance profile of a GPU: its name, NVML id, compute slices,
    memory, SMs, how many fit, and where (each placement's start and size in
    memory slices)."""
    name: str
    id: int
    slices: int
    memory: int                     # bytes
    sms: int
    count: int
    placements: tuple[tuple[int, int], ...] = ()
    free: int = 0                   # how many more fit now

    def wire(self) -> dict[str, Any]:
        return {"name": self.name, "id": self.id, "slices": self.slices,
                "memory": self.memory, "sms": self.sms, "count": self.count,
                "placements": [list(p) for p in self.placements], "free": self.free}


@dataclass(frozen=True)
class Instance:
    """A GPU instance: its id, profile, placement, and its MIG devices
    (compute instances: id and UUID)."""
    gi: int
    profile: str
    start: int
    size: int
    devices: tuple[tuple[int, str], ...] = ()

    def wire(self) -> dict[str, Any]:
        return {"gi": self.gi, "profile": self.profile, "start": self.start,
                "size": self.size, "devices": [{"ci": c, "uuid": u} for c, u in self.devices]}


@dataclass(frozen=True)
class GpuMig:
    """One GPU's MIG state."""
    index: int
    uuid: str
    name: str
    supported: bool
    enabled: bool
    pending: bool
    profiles: tuple[Profile, ...] = ()
    instances: tuple[Instance, ...] = field(default_factory=tuple)

    def wire(self) -> dict[str, Any]:
        return {"index": self.index, "uuid": self.uuid, "name": self.name,
                "supported": self.supported, "enabled": self.enabled,
                "pending": self.pending, "profiles": [p.wire() for p in self.profiles],
                "instances": [i.wire() for i in self.instances]}


def _code(e: Exception) -> int | None:
    return getattr(e, "value", None)


def _fail(e: Exception, what: str) -> VgpuError:
    """NVML's refusal of `what` as one line."""
    code = _code(e)
    if code == _NO_PERMISSION:
        return PermissionDenied(f"{what}: only root may change MIG (NVML: no permission)")
    if code == _IN_USE:
        return AdmissionRefused(f"{what}: in use: processes run there; end them first")
    if code == _INSUFFICIENT_RESOURCES:
        return AdmissionRefused(f"{what}: no room there: another instance takes part of "
                                "those slices (`vgpuctl mig` shows where they are free)")
    if code == _NOT_SUPPORTED:
        return UsageError(f"{what}: not supported on this GPU")
    return VgpuError(f"{what}: NVML: {e}")


def status(nv: Any, index: int) -> GpuMig:
    """GPU index's MIG state: its mode, profiles (when in MIG mode) and
    instances."""
    h = nv.nvmlDeviceGetHandleByIndex(index)
    uuid, name = nvml_text(nv.nvmlDeviceGetUUID(h)), nvml_text(nv.nvmlDeviceGetName(h))
    try:
        cur, pend = nv.nvmlDeviceGetMigMode(h)
    except nv.NVMLError:
        return GpuMig(index, uuid, name, False, False, False)
    enabled = int(cur) == 1
    if not enabled:
        return GpuMig(index, uuid, name, True, False, int(pend) == 1)
    profiles = tuple(sorted((p for p in (_profile(nv, h, pid) for pid in PROFILE_IDS) if p),
                            key=lambda p: (p.slices, p.memory, p.id)))
    instances = sorted((i for p in profiles for i in _instances(nv, h, p)),
                       key=lambda i: i.start)
    return GpuMig(index, uuid, name, True, True, int(pend) == 1, profiles, tuple(instances))


def _profile(nv: Any, h: Any, pid: int) -> Profile | None:
    try:
        info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, pid)
    except nv.NVMLError:
        return None
    mem = int(info.memorySizeMB) << 20
    name = nvml_text(getattr(info, "name", b"")).strip()
    name = name.rpartition(" ")[2] if name else f"{info.sliceCount}g.{round(mem / 1e9)}gb"
    placements: list[tuple[int, int]] = []
    try:
        arr = (nv.c_nvmlGpuInstancePlacement_t * _MAX_INSTANCES)()
        n = ctypes.c_uint(_MAX_INSTANCES)
        nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, arr, ctypes.byref(n))
        placements = [(int(arr[k].start), int(arr[k].size)) for k in range(n.value)]
    except nv.NVMLError:
        pass
    try:
        free = int(nv.nvmlDeviceGetGpuInstanceRemainingCapacity(h, info.id))
    except nv.NVMLError:
        free = 0
    return Profile(name, int(info.id), int(info.sliceCount), mem,
                   int(info.multiprocessorCount), int(info.instanceCount),
                   tuple(placements), free)


def _instances(nv: Any, h: Any, p: Profile) -> list[Instance]:
    arr = (nv.c_nvmlGpuInstance_t * _MAX_INSTANCES)()
    n = ctypes.c_uint(0)
    try:
        nv.nvmlDeviceGetGpuInstances(h, p.id, arr, ctypes.byref(n))
    except nv.NVMLError:
        return []
    out = []
    for k in range(min(n.value, _MAX_INSTANCES)):
        try:
            info = nv.nvmlGpuInstanceGetInfo(arr[k])
        except nv.NVMLError:
            continue
        out.append(Instance(int(info.id), p.name, int(info.placement.start),
                            int(info.placement.size),
                            tuple(_devices(nv, h, arr[k], int(info.id)))))
    return out


def _compute_instances(nv: Any, gi: Any) -> list[Any]:
    """The handles of GPU instance gi's compute instances, of every profile."""
    out = []
    for cpid in _CI_PROFILE_IDS:
        arr = (nv.c_nvmlComputeInstance_t * _MAX_INSTANCES)()
        n = ctypes.c_uint(0)
        try:
            nv.nvmlGpuInstanceGetComputeInstances(gi, cpid, arr, ctypes.byref(n))
        except nv.NVMLError:
            continue
        out += [arr[k] for k in range(min(n.value, _MAX_INSTANCES))]
    return out


def _devices(nv: Any, h: Any, gi: Any, gi_id: int) -> list[tuple[int, str]]:
    """The compute instances of GPU instance gi (id gi_id), with their MIG
    device's UUID."""
    out = []
    for ci in _compute_instances(nv, gi):
        try:
            cid = int(nv.nvmlComputeInstanceGetInfo(ci).id)
        except nv.NVMLError:
            continue
        out.append((cid, _mig_uuid(nv, h, gi_id, cid)))
    return sorted(out)


def _mig_uuid(nv: Any, h: Any, gi: int, ci: int) -> str:
    try:
        count = int(nv.nvmlDeviceGetMaxMigDeviceCount(h))
    except nv.NVMLError:
        return ""
    for k in range(count):
        try:
            m = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
            if (int(nv.nvmlDeviceGetGpuInstanceId(m)) == gi
                    and int(nv.nvmlDeviceGetComputeInstanceId(m)) == ci):
                return nvml_text(nv.nvmlDeviceGetUUID(m))
        except nv.NVMLError:
            continue
    return ""


def physical(states: Sequence[GpuMig], spec: str) -> GpuMig:
    """The GPU (not a MIG device) spec names, as `run --gpu` reads a GPU's
    name (placement.resolve_gpu): its NVML index, or its UUID or a unique
    prefix of it."""
    g = placement.resolve_gpu([placement.Gpu(s.index, s.uuid, s.name, 0) for s in states], spec)
    return next(s for s in states if s.index == g.index)


def mig_device(devices: Sequence[GpuStats], spec: str) -> GpuStats:
    """The MIG device spec names among the inventory's devices: its index,
    or its MIG- UUID or a unique prefix of it."""
    g = placement.resolve_gpu([d.as_gpu() for d in devices], spec)
    d = next(d for d in devices if d.uuid == g.uuid)
    if d.parent is None or d.gi is None:
        raise UsageError(f"GPU {g.index} is not a MIG device: `vgpuctl mig destroy` takes a "
                         "MIG device's index or MIG- UUID")
    return d


def parse_spec(text: str) -> tuple[str, int | None]:
    """``PROFILE[@START]`` ("3g.40gb@4") into its profile and start."""
    name, sep, start = text.strip().partition("@")
    if not name:
        raise UsageError(f"{text!r}: expected a profile such as 1g.10gb, with @START to "
                         "place it (3g.40gb@4)")
    if not sep:
        return name, None
    if not start.isdigit() or len(start) > 2:
        raise UsageError(f"{text!r}: the placement's start is a slice number (3g.40gb@4)")
    return name, int(start)


def find_profile(state: GpuMig, name: str) -> Profile:
    for p in state.profiles:
        if p.name == name:
            return p
    have = ", ".join(p.name for p in state.profiles) or "none"
    raise NotFound(f"GPU {state.index} has no MIG profile {name} (its profiles: {have})")


def create(nv: Any, index: int, spec: str) -> Instance:
    """Make a GPU instance of spec (``PROFILE[@START]``) on GPU index, with
    one compute instance of the whole of it; returns the instance."""
    name, start = parse_spec(spec)
    state = status(nv, index)
    if not state.enabled:
        raise UsageError(f"GPU {index} is not in MIG mode: `vgpuctl mig enable {index}` first")
    p = find_profile(state, name)
    if start is not None and start not in [s for s, _ in p.placements]:
        where = ", ".join(str(s) for s, _ in p.placements)
        raise UsageError(f"{name}@{start}: {name} starts at slice {where} only")
    h = nv.nvmlDeviceGetHandleByIndex(index)
    what = f"GPU {index}: {spec}"
    try:
        if start is None:
            gi = nv.nvmlDeviceCreateGpuInstance(h, p.id)
        else:
            pl = nv.c_nvmlGpuInstancePlacement_t()
            pl.start, pl.size = start, next(sz for s, sz in p.placements if s == start)
            gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(h, p.id, ctypes.byref(pl))
    except nv.NVMLError as e:
        raise _fail(e, what) from None
    try:
        cip = _whole_ci_profile(nv, gi, p.slices)
        nv.nvmlGpuInstanceCreateComputeInstance(gi, cip)
    except nv.NVMLError as e:
        try:
            nv.nvmlGpuInstanceDestroy(gi)
        except nv.NVMLError:
            pass
        raise _fail(e, f"{what}: its compute instance") from None
    info = nv.nvmlGpuInstanceGetInfo(gi)
    return Instance(int(info.id), p.name, int(info.placement.start), int(info.placement.size),
                    tuple(_devices(nv, h, gi, int(info.id))))


def _whole_ci_profile(nv: Any, gi: Any, slices: int) -> int:
    """The compute instance profile that takes the whole GPU instance."""
    for cpid in _CI_PROFILE_IDS:
        try:
            info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, cpid, 0)
        except nv.NVMLError:
            continue
        if int(info.sliceCount) == slices:
            return int(info.id)
    raise nv.NVMLError(_NOT_SUPPORTED)


def destroy(nv: Any, index: int, gi_id: int) -> None:
    """Destroy GPU instance gi_id of GPU index, its compute instances first."""
    h = nv.nvmlDeviceGetHandleByIndex(index)
    what = f"GPU {index} GPU instance {gi_id}"
    try:
        gi = nv.nvmlDeviceGetGpuInstanceById(h, gi_id)
    except nv.NVMLError as e:
        if _code(e) in (_NOT_FOUND, _INVALID_ARGUMENT):
            raise NotFound(f"{what}: no such instance") from None
        raise _fail(e, what) from None
    try:
        for ci in _compute_instances(nv, gi):
            nv.nvmlComputeInstanceDestroy(ci)
        nv.nvmlGpuInstanceDestroy(gi)
    except nv.NVMLError as e:
        raise _fail(e, what) from None


def set_mode(nv: Any, index: int, enable: bool) -> None:
    """Turn MIG mode on or off on GPU index (Hopper: at once, no reset)."""
    what = f"GPU {index}: MIG {'on' if enable else 'off'}"
    if not enable:
        left = status(nv, index).instances
        if left:
            raise AdmissionRefused(f"{what}: it has {len(left)} GPU instance"
                                   f"{'s' if len(left) > 1 else ''}: `vgpuctl mig destroy` "
                                   "their MIG devices first")
    h = nv.nvmlDeviceGetHandleByIndex(index)
    try:
        status_code = nv.nvmlDeviceSetMigMode(h, 1 if enable else 0)
    except nv.NVMLError as e:
        raise _fail(e, what) from None
    if status_code not in (0, None):
        raise _fail(nv.NVMLError(status_code), what)


def layout(nv: Any) -> list[GpuMig]:
    """Every GPU's MIG state."""
    return [status(nv, i) for i in range(nv.nvmlDeviceGetCount())]

