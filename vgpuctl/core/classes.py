"""Priority classes: who may use which, and what each job on a GPU heeds.
Pure: the daemon (vgpuctl.daemon.holds) writes what this decides into
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
class Seat:
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


def holds(members: Iterable[Seat], max_holders: int = MAX_HOLDERS) -> dict[Hashable, Hold]:
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


# -- signals that claim work the GPU doesn't run -----------------------------------
# A holder's signal says until when its launched work should keep the GPU
# busy; a held job naps meanwhile. An honest signal claims at most what its
# GPU runs (its work is part of the device's busy time). Sampled each tick:
# a holder whose signal claims the GPU busy a larger part of the time than
# the device is, by CLAIM_MARGIN, over CLAIM_WINDOW_S, is not believed for
# DISTRUST_S: the jobs it holds stop heeding it.
CLAIM_WINDOW_S = 1.0       # the averages' time constant
CLAIM_MARGIN = 0.5         # claimed busy fraction above the device's
DISTRUST_S = 5.0
CLAIM_MIN_SAMPLES = 8      # a holder is judged after this many samples


@dataclass
class _Claim:
    claimed: float = 0.0    # fraction of samples at which its signal said busy
    device: float = 0.0     # the device's busy fraction over the same time
    samples: int = 0
    distrusted_until: float = 0.0


class SignalCheck:
    """Whether each holder's signal is believed (module comment above):
    `sample` each tick with what its signal claims now and how busy the
    device was; `believed` when the held jobs' lists are written."""

    def __init__(self) -> None:
        self._claims: dict[Hashable, _Claim] = {}

    def sample(self, key: Hashable, claims_busy: bool, device_busy: float, now: float,
               dt: float) -> bool:
        """Take one sample of a holder's signal; True when this sample is the
        one that turned it distrusted."""
        c = self._claims.setdefault(key, _Claim())
        a = min(1.0, max(0.0, dt) / CLAIM_WINDOW_S)
        c.claimed += (float(claims_busy) - c.claimed) * a
        c.device += (min(1.0, max(0.0, device_busy)) - c.device) * a
        c.samples += 1
        if (now >= c.distrusted_until and c.samples >= CLAIM_MIN_SAMPLES
                and c.claimed - c.device > CLAIM_MARGIN):
            c.distrusted_until = now + DISTRUST_S
            return True
        return False

    def believed(self, key: Hashable, now: float) -> bool:
        c = self._claims.get(key)
        return c is None or now >= c.distrusted_until

    def forget(self, keep: Iterable[Hashable]) -> None:
        """Drop the holders no longer sampled."""
        live = set(keep)
        for k in [k for k in self._claims if k not in live]:
            del self._claims[k]
