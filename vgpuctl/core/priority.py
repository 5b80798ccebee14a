"""Priority classes: who may use which, and what each job on a GPU heeds.
Pure: the daemon (vgpuctl.daemon.priority) writes what this decides into
each job's limits, and the hooks act on it (libvgpu/hook/priority.c).

- ``high``: latency-sensitive. Jobs of a lower class on its GPU keep at most
  a small budget of estimated GPU time in flight while it is active, and
  launch nothing while its launched work should still be running.
- ``normal``: as jobs have always been; it holds ``low`` jobs back the same
  way.
- ``low``: best effort: it uses the GPU time the higher classes leave idle.

A job's class is in its limits, which only the daemon writes; the jobs a
held job heeds (its *holders*) are named there too, and only jobs admitted
with a higher class are named. See docs/compute.md, "Priority classes".
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from vgpuctl.errors import PermissionDenied

LOW = "low"
NORMAL = "normal"
HIGH = "high"
CLASSES = (LOW, NORMAL, HIGH)
# region.h VGPU_PRIORITY_*
RANK = {LOW: 0, NORMAL: 1, HIGH: 2}
# region.h VGPU_HOLD_*
HELD = 1
SIGNAL = 2
# region.h VGPU_MAX_HOLDERS
MAX_HOLDERS = 8


def rank(cls: str) -> int:
    return RANK.get(cls, RANK[NORMAL])


def promises(cls: str) -> bool:
    """Whether a job of this class may be promised a share (counted in its
    GPU's compute): normal and high; low is best effort."""
    return cls != LOW


def may_use(cls: str, user: str, groups: Iterable[str], admin: bool,
            high_users: Iterable[str], high_groups: Iterable[str]) -> bool:
    """Whether a user may run a job of class cls: low and normal, anyone;
    high, root (admin) and the users and groups the configuration names."""
    if cls != HIGH or admin:
        return True
    return user in set(high_users) or not set(groups).isdisjoint(high_groups)


def check_class(cls: str, user: str, groups: Iterable[str], admin: bool,
                high_users: Iterable[str], high_groups: Iterable[str]) -> None:
    """PermissionDenied when the user may not run a job of class cls."""
    if not may_use(cls, user, groups, admin, high_users, high_groups):
        raise PermissionDenied(
            f"user {user} may not run jobs of priority high (the daemon's [priority] "
            f"high_users and high_groups name who may)")


def check_change(old: str, new: str, job: str, admin: bool) -> None:
    """PermissionDenied when a user would raise their job's class: a user may
    lower it, only root may raise it."""
    if rank(new) > rank(old) and not admin:
        raise PermissionDenied(
            f"job {job} is of priority {old}: a user may lower a job's priority, only "
            f"root may raise it (start it with --priority {new} instead)")


@dataclass(frozen=True)
class Member:
    """A job on one GPU, as the classes see it."""
    key: Hashable           # the caller's key for (job, GPU)
    job_id: str
    dev: int                # the GPU's index in the job's region
    priority: str


@dataclass(frozen=True)
class Hold:
    """What one job on one GPU heeds (region.h vgpu_dev_limit.hold and
    holders): bits of HELD and SIGNAL, and its holders as (job id, device
    index in their region, class rank), the highest class first."""
    bits: int = 0
    holders: tuple[tuple[str, int, int], ...] = ()


def holds(members: Iterable[Member], max_holders: int = MAX_HOLDERS) -> dict[Hashable, Hold]:
    """For the jobs of one GPU: whom each heeds (every job of a higher
    class, at most max_holders: the highest classes first, then the oldest
    jobs) and whether it signals (a job of a lower class is there)."""
    ms = list(members)
    out: dict[Hashable, Hold] = {}
    for m in ms:
        r = rank(m.priority)
        higher = sorted((x for x in ms if rank(x.priority) > r),
                        key=lambda x: (-rank(x.priority), _id_order(x.job_id)))
        lower = any(rank(x.priority) < r for x in ms)
        bits = (HELD if higher else 0) | (SIGNAL if lower else 0)
        out[m.key] = Hold(bits, tuple((x.job_id, x.dev, rank(x.priority))
                                      for x in higher[:max_holders]))
    return out


def _id_order(job_id: str) -> tuple[int, str]:
    return (int(job_id), job_id) if job_id.isdigit() else (1 << 62, job_id)
