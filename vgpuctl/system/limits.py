"""A job's limits segment (struct vgpu_limits): written by the daemon only,
through its own attachment; the job attaches it read-only."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vgpuctl.system.structs import const, ffi


@dataclass
class DeviceLimit:
    uuid: str
    mem_limit: int = 0          # bytes, 0 = none
    core_share: int = 100       # percent
    policy: int = 0             # VGPU_POLICY_HARD / VGPU_POLICY_SOFT
    throttle: int = 0           # VGPU_GATE_*: open, turns, closed
    ctx_overhead: int = 0


class RegionLimits:
    """Region's limits: each device's, written live by the daemon (through
    a writable attachment) and read back."""

    path: Path
    limits: Any
    _lwritable: bool
    _laddr: int | None

    def _writable(self) -> None:
        if not self._lwritable or self._laddr is None:
            raise PermissionError(f"{self.path}: the limits segment is not attached writable")

    def set_devices(self, devices: list[DeviceLimit]) -> None:
        self._writable()
        f = ffi()
        lim = self.limits
        for i, d in enumerate(devices):
            self._write_dev(i, d)
            lim.dev[i].prev_signal_id = -1     # no turn before (vgpuctl.system.turn_fields)
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
        dev.throttle = int(d.throttle)

    def update_device(self, i: int, **changes: Any) -> None:
        """Change some fields of device i's limits live."""
        self._writable()
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
            core_share=dev.core_share, policy=dev.policy, throttle=int(dev.throttle),
            ctx_overhead=dev.ctx_overhead)

    def devices(self) -> list[DeviceLimit]:
        return [self.device(i) for i in range(self.limits.ndevices)]

    @property
    def job_id(self) -> str:
        return ffi().string(self.limits.job_id).decode()
