"""What counts as tampering with a job's usage region. Pure: the daemon
(vgpuctl.daemon.trust) reads the region and hands the figures in.

The usage region is the job's own file: the hook writes its counters there,
and so can anything else the job's user runs. The daemon flags a job, ignores
its counters from then on and closes its compute gate for good (its kernel
launches fail) when it finds there what the hook never writes: a value out
of any possible range (`check_counters`, and the format checks of
vgpuctl.system.region), or more gated launches than its gate granted (the
compute governor's books).
"""

from __future__ import annotations

from dataclasses import dataclass

from vgpuctl.core.job import DeviceUsage


@dataclass(frozen=True)
class Gate:
    """What the daemon wrote into a device's limits: the hook's gate."""
    throttle: bool
    refill_rate: int        # tokens per second
    bucket_size: int        # tokens
OPEN = Gate(False, 0, 0)
CLOSED = Gate(True, 0, 0)


def check_counters(devs: list[DeviceUsage], totals: list[int],
                   limits: list[int]) -> str | None:
    """Why the hook can't have written these device counters (None: it
    can have). totals: each GPU's memory; limits: the job's limit on each.
    The hook never counts more than it reserved, and it reserves no more
    than the driver gave it: a peak beyond twice the larger of the GPU and
    the limit (a limit may be set below what is held) is no reading."""
    for i, d in enumerate(devs):
        total = totals[i] if i < len(totals) else 0
        limit = limits[i] if i < len(limits) else 0
        if d.peak > 2 * max(total, limit):
            return f"peak = {d.peak} bytes, far more than the GPU's {total}"
    return None
