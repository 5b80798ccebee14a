"""Violations: what NVML says the GPU's processes hold and use, against the
jobs the daemon knows. Pure: the daemon's watcher (vgpuctl.daemon.violations)
reads NVML and /proc and hands the figures in.

Three kinds, each named by the process NVML lists:

- ``memory``: a job's processes hold more by NVML than its memory limit (a
  process without the hook, or a hook it walked past). The process named is
  the largest holder of the job on that GPU.
- ``compute``: a job uses more than its compute share by a margin
  (`COMPUTE_MARGIN`, at least `COMPUTE_MARGIN_MIN` of the GPU) for
  `COMPUTE_SUSTAIN_S` in a row (a launch gate bypassed). The process named is
  the job's busiest on that GPU.
- ``no_job``: a process on a managed GPU that belongs to no job (run outside
  ``vgpuctl run``, or escaped from its job).

A violation is *new* when its (kind, job, pid) was not found at the previous
check; it is logged, counted and recorded once, and found again at every
check while it lasts (so ``kill`` is retried until the process is gone).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

MEMORY = "memory"
COMPUTE = "compute"
NO_JOB = "no_job"
KINDS = (MEMORY, COMPUTE, NO_JOB)

# Over its share by this fraction of the share, and at least this much of
# the GPU, for this long: a compute violation.
COMPUTE_MARGIN = 0.25
COMPUTE_MARGIN_MIN = 0.10
COMPUTE_SUSTAIN_S = 1.5

ON_VIOLATION = ("report", "kill")


@dataclass(frozen=True)
class JobLimits:
    """What a job may use on one GPU, and what it is seen to use."""
    job_id: str
    uuid: str
    mem_limit: int          # bytes
    share: float            # 0..1: its core share (or more, while a soft job borrows)
    measured: float | None  # 0..1: the governor's last measured share, None unknown


@dataclass(frozen=True)
class Violation:
    kind: str
    uuid: str
    pid: int
    job_id: str | None      # None for no_job
    value: float            # bytes (memory, no_job) or share 0..1 (compute)
    limit: float            # bytes or share; 0 for no_job

    @property
    def key(self) -> tuple[str, str | None, int]:
        return (self.kind, self.job_id, self.pid)

    def describe(self) -> str:
        if self.kind == MEMORY:
            return (f"job {self.job_id}: pid {self.pid} and its job hold {_mib(self.value)} "
                    f"by NVML on {self.uuid}, over the job's limit of {_mib(self.limit)}")
        if self.kind == COMPUTE:
            return (f"job {self.job_id}: uses {self.value:.0%} of {self.uuid} for "
                    f"{COMPUTE_SUSTAIN_S:g} s, over its share of {self.limit:.0%} "
                    f"(busiest pid {self.pid})")
        return (f"pid {self.pid} holds {_mib(self.value)} on {self.uuid} and belongs to "
                f"no job")


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def compute_threshold(share: float) -> float:
    return share + max(COMPUTE_MARGIN * share, COMPUTE_MARGIN_MIN)


@dataclass
class Checker:
    """Finds the violations of one check; remembers what was found before
    (new ones) and how long each job has been over its share."""
    over_since: dict[tuple[str, str], float] = field(default_factory=dict)
    seen: set[tuple[str, str | None, int]] = field(default_factory=set)

    def check(self, now: float, limits: list[JobLimits],
              memory: Mapping[str, Mapping[int, int]],
              busy: Mapping[str, Mapping[int, float]],
              owner: Mapping[tuple[str, int], str | None]) -> tuple[list[Violation],
                                                                    list[Violation]]:
        """(all violations now, the new ones among them).

        memory: uuid -> {pid: bytes} from NVML's compute processes; busy:
        uuid -> {pid: share} of NVML's last utilization window (may be
        empty); owner: (uuid, pid) -> job id or None for every pid in memory.
        """
        found: list[Violation] = []
        for uuid, procs in memory.items():
            for pid, used in procs.items():
                if owner.get((uuid, pid)) is None:
                    found.append(Violation(NO_JOB, uuid, pid, None, float(used), 0.0))
        live: set[tuple[str, str]] = set()
        for lim in limits:
            procs = {p: b for p, b in memory.get(lim.uuid, {}).items()
                     if owner.get((lim.uuid, p)) == lim.job_id}
            held = sum(procs.values())
            if procs and held > lim.mem_limit:
                pid = max(procs, key=lambda p: (procs[p], -p))
                found.append(Violation(MEMORY, lim.uuid, pid, lim.job_id, float(held),
                                       float(lim.mem_limit)))
            key = (lim.job_id, lim.uuid)
            live.add(key)
            if lim.measured is None or lim.measured <= compute_threshold(lim.share):
                self.over_since.pop(key, None)
                continue
            since = self.over_since.setdefault(key, now)
            if now - since < COMPUTE_SUSTAIN_S:
                continue
            shares = busy.get(lim.uuid, {})
            cand = [p for p in procs if shares.get(p, 0.0) > 0] or list(procs)
            if not cand:
                continue    # no process of it on NVML's list: none to name
            pid = max(cand, key=lambda p: (shares.get(p, 0.0), procs[p], -p))
            found.append(Violation(COMPUTE, lim.uuid, pid, lim.job_id, lim.measured,
                                   lim.share))
        for key in [k for k in self.over_since if k not in live]:
            del self.over_since[key]
        keys = {v.key for v in found}
        new = [v for v in found if v.key not in self.seen]
        self.seen = keys
        return found, new
