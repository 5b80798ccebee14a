"""What is done about the violations found (vgpuctl.core.violations), as
``on_violation`` says (`act`). Pure: the daemon's watch
(vgpuctl.daemon.watch) hands in what it found and does what this
returns.

- ``report``: nothing but the record.
- ``protect`` (the default): memory taken past a job's limit is stopped
  where it takes what another job's limit promised: on a GPU where the
  memory free is less than what the jobs' limits still promise them
  (``shortfall``), a job past its limit by more than `tolerance` (the
  driver's own growth of a context is not an attack) is ended, and a
  process in no job holding memory there is killed; so is a job past its
  limit by more than the memory the operator keeps aside for what no limit
  accounts for (``reserve``), wherever it is. Compute taken past a hook
  where another user's job has a turn (scope ``BYPASS``) ends its job:
  the turns are the promise, and such work breaks whoever's turn it lands
  in. Other compute is reported (a gated job's turns already bound it).
- ``kill``: every violation is acted on: a job over its memory or its
  compute budget is ended, a process in no job is killed.

Ending a job means every process of it, not the one named, and its gate
closed; `Cooldown` holds the new jobs of a user whose jobs were ended
repeatedly.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from vgpuctl.core.violations import BYPASS, COMPUTE, MEMORY, JobLimits, Violation

REPORT = "report"
PROTECT = "protect"
KILL = "kill"
ON_VIOLATION = (REPORT, PROTECT, KILL)
DEFAULT_ON_VIOLATION = PROTECT
# protect ends a job past its memory limit by more than this (bytes, and a
# share of the limit): the driver's own growth of a context is not an attack.
TOLERANCE_MIN = 64 << 20
TOLERANCE = 0.02


@dataclass(frozen=True)
class GpuMemory:
    """A GPU's memory as NVML shows it, for `act`."""
    uuid: str
    total: int
    used: int | None        # the whole GPU's, None unknown


@dataclass(frozen=True)
class Actions:
    end: dict[str, Violation]   # job id -> the violation that ends it
    kill: list[Violation]       # processes in no job to kill


def tolerance(limit: float) -> float:
    """How far past its limit a job may be before `protect` ends it: the
    driver's own growth of a context (a kernel's local memory, which the hook
    can't see) is tens of megabytes; a bypass takes gigabytes."""
    return max(TOLERANCE_MIN, TOLERANCE * limit)


def shortfall(gpu: GpuMemory, limits: Iterable[JobLimits], held: Mapping[str, int]) -> int:
    """Bytes the jobs on a GPU were promised and could not get now: what
    their limits still promise them (limit less what NVML shows them hold,
    for each job within its limit) less the memory free. Positive: someone
    holds memory promised to a job."""
    if gpu.used is None:
        return 0
    promised = sum(max(lim.mem_limit - held.get(lim.job_id, 0), 0) for lim in limits
                   if lim.uuid == gpu.uuid)
    return promised - max(gpu.total - gpu.used, 0)


def act(found: Iterable[Violation], on_violation: str, gpus: Mapping[str, GpuMemory],
        limits: Iterable[JobLimits], held: Mapping[tuple[str, str], int],
        reserve: int) -> Actions:
    """What to do about the violations found, as on_violation says (the
    module docstring). held: (job id, uuid) -> bytes NVML shows the job
    hold."""
    end: dict[str, Violation] = {}
    kill: list[Violation] = []
    if on_violation == REPORT:
        return Actions(end, kill)
    limits = list(limits)
    short: dict[str, int] = {}
    for uuid, gpu in gpus.items():
        short[uuid] = shortfall(gpu, limits, {j: b for (j, u), b in held.items() if u == uuid})
    for v in found:
        if on_violation == KILL or _protects(v, short.get(v.uuid, 0), reserve):
            if v.job_id is not None:
                end.setdefault(v.job_id, v)
            elif v.pid > 0:
                kill.append(v)
    return Actions(end, kill)


def _protects(v: Violation, short: int, reserve: int) -> bool:
    """Whether `protect` acts on a violation: memory taken that others were
    promised (short: what the GPU's jobs were promised and can't get), and
    compute taken past a hook where another user's job has a turn."""
    if v.kind == COMPUTE:
        return v.scope == BYPASS and v.job_id is not None
    if v.kind == MEMORY:
        over = v.value - v.limit
        return v.job_id is not None and over > tolerance(v.limit) and (short > 0
                                                                        or over > reserve)
    return not v.share_unit and v.pid > 0 and short > 0     # NO_JOB holding memory


@dataclass
class Cooldown:
    """The users whose jobs were ended for violations: after `after` of them
    within `hold_s`, the user's new jobs are held until `hold_s` after the
    last one."""
    ends: dict[int, deque[float]] = field(default_factory=dict)

    def note(self, uid: int, now: float) -> None:
        q = self.ends.setdefault(uid, deque(maxlen=64))
        q.append(now)

    def held_until(self, uid: int, now: float, after: int, hold_s: float) -> float | None:
        """When the user's new jobs may start again; None when they may now."""
        q = self.ends.get(uid)
        if not q or hold_s <= 0 or after <= 0:
            return None
        recent = [t for t in q if t > now - hold_s]
        if len(recent) < after:
            return None
        return recent[-1] + hold_s
