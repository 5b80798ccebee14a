"""Priority classes in a job's region (region.h): the class fields of its
limits, written here, and its signal, read here. The signal is the job's
own System V segment (made by the daemon with the region, written by the
job's hook): it is copied whole into our memory and checked, and a wrong
magic is no reading."""

from __future__ import annotations

from dataclasses import dataclass

from vgpuctl.system.region import Region
from vgpuctl.system.structs import const, ffi


@dataclass(frozen=True)
class ClassFields:
    """What the daemon writes into one device's limits for the classes."""
    priority: int = 1                   # VGPU_PRIORITY_*
    hold: int = 0                       # VGPU_HOLD_* bits
    # (job id, device, class rank, its signal's segment id)
    holders: tuple[tuple[str, int, int, int], ...] = ()
    budget_ns: int = 0
    holdoff_ns: int = 0


def write_class(region: Region, i: int, c: ClassFields) -> None:
    """Write device i's class fields. The holders are rewritten between two
    bumps of holders_gen (odd meanwhile), so a hook never takes a list half
    written for a whole one."""
    f = ffi()
    dev = region.limits.dev[i]
    n = min(len(c.holders), const("VGPU_MAX_HOLDERS"))
    if read_class(region, i).holders != tuple(c.holders[:n]):
        dev.holders_gen += 1 if dev.holders_gen % 2 == 0 else 2
        id_len = const("VGPU_JOB_ID_LEN")
        for k in range(const("VGPU_MAX_HOLDERS")):
            job_id, d, rank, sid = c.holders[k] if k < n else ("", 0, 0, -1)
            raw = job_id.encode()[: id_len - 1]
            f.memmove(dev.holders[k].job_id, raw + b"\0" * (id_len - len(raw)), id_len)
            dev.holders[k].dev = d
            dev.holders[k].priority = rank
            dev.holders[k].signal_id = sid
        dev.nholders = n
        dev.holders_gen += 1
    dev.priority = c.priority
    dev.budget_ns = c.budget_ns
    dev.holdoff_ns = c.holdoff_ns
    dev.hold = c.hold
    region.limits.generation += 1


def read_class(region: Region, i: int) -> ClassFields:
    f = ffi()
    dev = region.limits.dev[i]
    n = min(int(dev.nholders), const("VGPU_MAX_HOLDERS"))
    return ClassFields(
        priority=int(dev.priority), hold=int(dev.hold),
        holders=tuple((f.string(dev.holders[k].job_id).decode(), int(dev.holders[k].dev),
                       int(dev.holders[k].priority), int(dev.holders[k].signal_id))
                      for k in range(n)),
        budget_ns=int(dev.budget_ns), holdoff_ns=int(dev.holdoff_ns))


@dataclass(frozen=True)
class SignalDev:
    last_launch_ns: int
    busy_until_ns: int
    launches: int


def read_signal(region: Region, ndevices: int) -> list[SignalDev] | None:
    """A job's signal, per device (at most ndevices); None when it is not
    attached or holds no signal of this layout (its owner overwrote it)."""
    f = ffi()
    data = region.signal_bytes()
    if data is None:
        return None
    buf = f.new("struct vgpu_signal *")
    f.memmove(buf, data, len(data))
    if buf.magic != const("VGPU_SIGNAL_MAGIC") or buf.version != const("VGPU_REGION_VERSION"):
        return None
    n = min(ndevices, const("VGPU_MAX_DEVICES"))
    return [SignalDev(int(buf.dev[k].last_launch_ns), int(buf.dev[k].busy_until_ns),
                      int(buf.dev[k].launches)) for k in range(n)]
