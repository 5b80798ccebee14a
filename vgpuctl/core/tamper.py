"""What counts as tampering with a job's usage region, and how sure the daemon
must be before it acts. Pure: the daemon (vgpuctl.daemon.trust) reads the
region and hands the figures in.

The usage region is the job's own segment: the hook writes its counters
there, and so can anything else the job's user runs. The daemon flags a job,
ignores its counters from then on and closes its compute gate for good (its
kernel launches fail) only on *proof*: something the hook can never have
written, whatever the machine's load did to either side's timing:

- **an impossible value** (`check_counters`, and the format checks of
  vgpuctl.system.usage: a header that is not the region's, a byte counter
  beyond any GPU): no hook writes it, on any schedule;
- **a counter that went back** (`went_back`): the hook only ever adds to its
  launch and GPU-time counters.

Nothing else closes a gate. The counters a job writes decide nothing of its
neighbours: its turns are the daemon's (vgpuctl.core.turns) and its hook
keeps to them by its own measure of its own GPU time, so a job that lies
about its GPU time lies to its own bill and its own view. What NVML sees
(busy time no hook accounts for, memory over a limit) is a violation, not
tampering: vgpuctl.core.violations, reported or acted on as `on_violation`
says. A verdict on timing alone is never proof: the daemon's and the job's
threads are scheduled by a loaded machine, and an honest job must never be
punished for that.
"""

from __future__ import annotations

from vgpuctl.core.job import DeviceUsage


def went_back(before: list[DeviceUsage], now: list[DeviceUsage]) -> str | None:
    """Why the hook can't have gone from one reading to the next (None: it
    can have): its launch and GPU-time counters only grow."""
    for i, (b, n) in enumerate(zip(before, now, strict=False)):
        if n.launches < b.launches:
            return f"its launch counter of GPU {i} went back by {b.launches - n.launches}"
        if n.busy_ns < b.busy_ns:
            return f"its GPU-time counter of GPU {i} went back by {b.busy_ns - n.busy_ns} ns"
    return None


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
