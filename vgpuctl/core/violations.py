"""Violations: what NVML says the GPU's processes hold and use, against the
jobs the daemon knows, and what is done about them. Pure: the daemon's
watch (vgpuctl.daemon.watch) reads NVML and /proc, attributes each
process NVML lists to its job *when NVML reports it* (by its ancestry, its
job's launcher, or its Slurm job's cgroup), and hands the figures in.

Three kinds:

- ``memory``: a job's processes hold more by NVML than its memory limit (a
  process without the hook, or a hook it walked past). The process named is
  the largest holder of the job on that GPU.
- ``compute``: a job, or the sum of one user's jobs on a GPU, used more GPU
  time than its share allows, integrated over time (below). The process
  named is the job's busiest on that GPU.
- ``no_job``: a process on a managed GPU that belongs to no job (run outside
  ``vgpuctl run``, or escaped from its job) holds memory there, or busy time
  that no job claims adds up past the same budget (a process too short-lived
  to be seen alive, or in no job).

**The compute budget.** The watch's split (vgpuctl.daemon.busysplit) gives
each process's busy seconds in each sample window. A job may use its share
(one that may borrow, soft or with no share: also what the other jobs'
promises left open in the window) plus a margin relative to it
(`MARGIN` of it, at least `MARGIN_MIN` of the GPU); what it uses beyond
that accumulates as a debt, which what it leaves unused pays back down to
zero (the accounts: vgpuctl.core.compute_debt). A debt past `BURST_S`
GPU-seconds is a violation. The same budget holds for the sum of each
user's jobs on a GPU (their shares summed, the margin of the sum), so that
eight jobs at ``--core 1`` are one offender, not eight within their margins. A patient
attacker can't stay under it: a duty cycle, a train of short processes or
one steady overrun all add to the same integral; the most any pattern gets
past the budget is ``BURST_S`` once, then the margin. Why these numbers:

- the share in force is the highest one of the last `GRACE_S` seconds (a
  `set --core` that lowered it, or a soft job's borrowing that ended, takes
  a moment to reach work already queued on the GPU);
- an honest job's gate holds it at its share to within a few points (the
  governor's own figures, docs/benchmarks.md), its token bucket never holds
  more than 30 ms of launches, and NVML reports in whole percents: the
  margin covers the controller's error and the rounding, `BURST_S` its
  transients (a job's first second, before the gate knows its kernels; a
  burst right after an idle spell);
- a violation of the sum of a user's jobs names each of the user's jobs on
  that GPU that used more than its own share in the same time.

**Busy time that went through no gate.** The burst is there for what the
gate of an honest job lets slip: a job's first second, before the gate
knows its kernels; a burst after an idle spell; a `set` or a soft job's
borrowing that ended, taking effect on work already queued. Busy time of a
job's processes that never loaded the hook (no slot in the job's region:
`hooked`) went through no gate, and has none of that to excuse: while a
debt holds any of it, the burst is `BURST_UNGATED_S`. (A job's user can
write a slot for an unhooked process, its region being theirs: that
process is then held to the burst of a gated one, `BURST_S`.) Where another
user's job on a GPU has a turn, busy time through no gate
time-slices with whoever holds the GPU and hides in that job's own measure:
beyond what the job's own turn left unused it is a debt of the user's
against `UNGATED_MIN` of the GPU, a violation of scope ``BYPASS`` past
`BURST_UNGATED_S`.

A violation is *new* when its key was not found at the previous check; it
is logged, counted and recorded once, and found again at every check while
it lasts.

What is done about them, as ``on_violation`` says, is
vgpuctl.core.enforcement's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field

from vgpuctl.core.compute_debt import (
    BURST_S,
    MARGIN_MIN,
    SHOWN_S,
    UNGATED_MIN,
    Account,
    UserSum,
    allowed,
)
from vgpuctl.core.job import JobOnGpu

MEMORY = "memory"
COMPUTE = "compute"
NO_JOB = "no_job"
KINDS = (MEMORY, COMPUTE, NO_JOB)

# The compute budget's margin, bursts and noise floor, and its accounts,
# are vgpuctl.core.compute_debt's.
# A share stays in force this long after it was lowered.
GRACE_S = 2.0

# Violation scopes: a job's own use, the sum of its user's jobs on the GPU,
# the sum of its user's work past their hooks and turns (where another
# user's job on the GPU has a turn).
JOB = "job"
USER = "user"
BYPASS = "bypass"


@dataclass(frozen=True)
class JobLimits:
    """What a job may use on one GPU."""
    job_id: str
    uuid: str
    mem_limit: int          # bytes
    share: float            # 0..1: its core share (0: none)
    uid: int = -1           # its user (the budget of the sum of a user's jobs)
    borrows: bool = False   # it may use what the others leave (soft, or no share)
    turn: float = 0.0       # the share of the GPU its turn holds (0: it has none)
    given: bool = True      # False: a GPU it was not given (a limit of zero)

    @staticmethod
    def of(on: JobOnGpu, turn: float, closed: bool = False) -> JobLimits:
        """A job's limits on one GPU from the job there; closed: it holds
        nothing (suspended), so its memory limit is zero. A job that may
        borrow (soft, or no share) may use what the others' promises leave
        open."""
        return JobLimits(on.job_id, on.uuid, 0 if closed else on.mem_limit,
                         on.core / 100 if on.core < 100 else 0.0, on.uid,
                         borrows=on.policy == "soft" or on.core >= 100, turn=turn)


@dataclass(frozen=True)
class ProcWindow:
    """NVML's busy time per process on one GPU between two instants."""
    uuid: str
    start: float            # seconds (NVML's clock)
    end: float
    busy: Mapping[int, float]   # pid -> GPU-busy seconds in the window

    @property
    def duration(self) -> float:
        return max(self.end - self.start, 0.0)


@dataclass(frozen=True)
class Violation:
    kind: str
    uuid: str
    pid: int
    job_id: str | None      # None for no_job
    value: float            # bytes (memory, a no_job holder) or share 0..1 (compute, busy)
    limit: float            # bytes or share; 0 for no_job
    scope: str = JOB        # compute: JOB, or USER (the sum of the user's jobs)
    uid: int | None = None  # compute of a USER scope: whose jobs
    share_unit: bool = False    # value and limit are shares (compute, unclaimed busy)
    burst: float = BURST_S      # compute: the burst it went past (GPU-seconds)
    borrows: bool = False       # compute of a job that may borrow: its budget had what was open

    @property
    def key(self) -> tuple[str, str | None, int | str]:
        """What makes a violation the same one from check to check: a process
        for memory, a job (or the unclaimed time) on a GPU for compute."""
        if self.kind == MEMORY or (self.kind == NO_JOB and not self.share_unit):
            return (self.kind, self.job_id, self.pid)
        return (self.kind if self.scope == JOB else f"{self.kind}/{self.scope}", self.job_id,
                self.uuid)

    def describe(self) -> str:
        if self.kind == MEMORY:
            return (f"job {self.job_id}: pid {self.pid} and its job hold {_mib(self.value)} "
                    f"by NVML on {self.uuid}, over the job's limit of {_mib(self.limit)}")
        gate = ", some of it through no gate" if self.burst < BURST_S else ""
        if self.kind == COMPUTE and self.scope == BYPASS:
            return (f"job {self.job_id}: processes of uid {self.uid} use {self.value:.0%} of "
                    f"{self.uuid} past their hooks, where other users' jobs take turns, more than "
                    f"{self.burst:g} GPU-seconds beyond what their own turns left "
                    f"(busiest pid {self.pid})")
        if self.kind == COMPUTE and self.scope == USER:
            return (f"job {self.job_id}: the jobs of uid {self.uid} on {self.uuid} use "
                    f"{self.value:.0%} of it together, over their shares' {self.limit:.0%} "
                    f"by more than {self.burst:g} GPU-seconds{gate} (busiest pid {self.pid})")
        if self.kind == COMPUTE:
            open_ = " and what the others' promises left open" if self.borrows else ""
            return (f"job {self.job_id}: uses {self.value:.0%} of {self.uuid}, over its share "
                    f"of {self.limit:.0%}{open_} by more than {self.burst:g} GPU-seconds{gate} "
                    f"(busiest pid {self.pid})")
        if self.share_unit:
            return (f"{self.value:.0%} of {self.uuid} busy in processes no job claims, "
                    f"more than {BURST_S:g} GPU-seconds (busiest pid {self.pid})")
        return (f"pid {self.pid} holds {_mib(self.value)} on {self.uuid} and belongs to "
                f"no job")


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.0f} MiB"


@dataclass
class Checker:
    """Finds the violations of one check; remembers what was found before
    (new ones), each account's debt, and each job's recent shares."""
    seen: set[tuple[str, str | None, int | str]] = field(default_factory=set)
    _jobs: dict[tuple[str, str], Account] = field(default_factory=dict)     # (job, uuid)
    _raw: dict[tuple[str, str], Account] = field(default_factory=dict)      # ...against its share
    _users: dict[tuple[int, str], Account] = field(default_factory=dict)    # (uid, uuid)
    # (uid, uuid): a user's busy time past its jobs' hooks and turns, where
    # another user's job on the GPU has a turn; and when each job last had some
    _bypass: dict[tuple[int, str], Account] = field(default_factory=dict)
    _bypassed: dict[tuple[str, str], float] = field(default_factory=dict)
    _none: dict[str, Account] = field(default_factory=dict)                 # uuid: unclaimed
    _shares: dict[tuple[str, str], deque[tuple[float, float]]] = field(default_factory=dict)
    _busiest: dict[tuple[str | None, str], int] = field(default_factory=dict)
    _uids: dict[str, int] = field(default_factory=dict)

    def debts(self) -> dict[str, float]:
        """Each job's debt now, the highest of its own and its user's on any
        of its GPUs (GPU-seconds: a violation past BURST_S)."""
        out: dict[str, float] = {}
        for (job, uuid), use in self._jobs.items():
            user = self._users.get((self._uids.get(job, -1), uuid))
            out[job] = max(out.get(job, 0.0), use.debt, user.debt if user else 0.0)
        return out

    def _share_in_force(self, key: tuple[str, str], at: float) -> float:
        """The highest share the job had in the last GRACE_S seconds."""
        hist = self._shares.get(key)
        if not hist:
            return 0.0
        # Each share was in force from its time to the next one's.
        best = hist[-1][1]
        for (_, share), (until, _) in zip(hist, list(hist)[1:], strict=False):
            if until >= at - GRACE_S:
                best = max(best, share)
        return best

    def check(self, now: float, limits: list[JobLimits],
              memory: Mapping[str, Mapping[int, int]],
              windows: Iterable[ProcWindow],
              owner: Mapping[tuple[str, int], str | None],
              hooked: Container[int] | None = None
              ) -> tuple[list[Violation], list[Violation]]:
        """(all violations now, the new ones among them).

        memory: uuid -> {pid: bytes} from NVML's compute processes; windows:
        NVML's busy time per pid since the previous check (oldest first, any
        GPU; none where NVML gives none); owner: (uuid, pid) -> job id, or
        None (no job), for every pid of memory and windows; hooked: the pids
        of windows that loaded the hook (a slot in their job's region; None:
        unknown, all taken as gated). `now` is on the clock of the windows'
        times.
        """
        windows = list(windows)
        limits = list(limits) + _strays(limits, memory, windows, owner)
        self._uids = {lim.job_id: lim.uid for lim in limits}
        found = _memory(limits, memory, owner)
        by_gpu: dict[str, list[JobLimits]] = {}
        for lim in limits:
            by_gpu.setdefault(lim.uuid, []).append(lim)
            hist = self._shares.setdefault((lim.job_id, lim.uuid), deque())
            if not hist or hist[-1][1] != lim.share:
                hist.append((now, lim.share))
            while len(hist) > 2 and hist[1][0] < now - 2 * GRACE_S:
                hist.popleft()
        for w in windows:
            self._account(w, by_gpu.get(w.uuid, []), owner, hooked)
        found += self._compute(by_gpu, memory, owner)
        self._forget({(lim.job_id, lim.uuid) for lim in limits},
                     {(lim.uid, lim.uuid) for lim in limits})
        keys = {v.key for v in found}
        new = [v for v in found if v.key not in self.seen]
        self.seen = keys
        return found, new

    def _per_job(self, w: ProcWindow, given: Container[str],
                 owner: Mapping[tuple[str, int], str | None], hooked: Container[int] | None
                 ) -> tuple[dict[str, float], dict[str, float], float]:
        """A window's busy time by job: all of it, what went through no gate
        (a process that never loaded the hook, or any of a job on a GPU it
        was not given), and what no job claims; notes each job's busiest."""
        per_job: dict[str, float] = {}
        ungated: dict[str, float] = {}
        unclaimed = 0.0
        top: dict[str | None, tuple[float, int]] = {}
        for pid, b in w.busy.items():
            b = min(max(float(b), 0.0), w.duration)
            job = owner.get((w.uuid, pid))
            if job is None:
                unclaimed += b
            else:
                per_job[job] = per_job.get(job, 0.0) + b
                if (hooked is not None and pid not in hooked) or job not in given:
                    ungated[job] = ungated.get(job, 0.0) + b
            if b > top.get(job, (0.0, 0))[0]:
                top[job] = (b, pid)
        for job, (_, pid) in top.items():
            self._busiest[(job, w.uuid)] = pid
        return per_job, ungated, unclaimed

    def _forget(self, live: set[tuple[str, str]], users: set[tuple[int, str]]) -> None:
        """Drop the accounts of jobs and users no longer on their GPUs."""
        for store in (self._jobs, self._raw, self._shares, self._bypassed):
            for key in [k for k in store if k not in live]:
                del store[key]
        for ustore in (self._users, self._bypass):
            for ukey in [k for k in ustore if k not in users]:
                del ustore[ukey]

    def _account(self, w: ProcWindow, jobs: list[JobLimits],
                 owner: Mapping[tuple[str, int], str | None],
                 hooked: Container[int] | None) -> None:
        dt = w.duration
        if dt <= 0:
            return
        per_job, ungated, unclaimed = self._per_job(w, {lim.job_id for lim in jobs if lim.given},
                                                    owner, hooked)
        # the users whose work past a hook lands in another user's turn
        turns = {lim.uid for lim in jobs if lim.turn > 0}
        exposed = {lim.uid for lim in jobs if turns - {lim.uid}}
        # Each job's use of its own promise in the window; what the others'
        # promises left open is the rest of the GPU, and a job that may
        # borrow may use it.
        shares = {lim.job_id: self._share_in_force((lim.job_id, lim.uuid), w.end)
                  for lim in jobs}
        kept = {j: min(per_job.get(j, 0.0) / dt, s) for j, s in shares.items()}
        taken = sum(kept.values())
        sums: dict[int, UserSum] = {}
        for lim in jobs:
            key = (lim.job_id, lim.uuid)
            share = shares[lim.job_id]
            busy = min(per_job.get(lim.job_id, 0.0), dt)
            free = ungated.get(lim.job_id, 0.0)
            budget = share + max(1.0 - taken + kept[lim.job_id], 0.0) if lim.borrows \
                else share
            self._jobs.setdefault(key, Account()).add(w.end, dt, busy, allowed(min(budget, 1.0)),
                                                   free)
            self._raw.setdefault(key, Account()).add(w.end, dt, busy, share)
            # Where another user's job has a turn, work past a hook
            # time-slices with whoever holds the GPU, and that job's own
            # measure of its turn then holds it: none is allowed beyond what
            # the job's own turn left unused.
            past = max(free - max(lim.turn * dt - (busy - free), 0.0), 0.0) \
                if lim.uid in exposed else 0.0
            if past > UNGATED_MIN * dt:
                self._bypassed[key] = w.end
            sums.setdefault(lim.uid, UserSum()).add(busy, share, free, past, kept[lim.job_id],
                                                 lim.borrows)
        for uid, u in sums.items():
            share = u.share + max(1.0 - taken + u.kept, 0.0) if u.borrows else u.share
            self._users.setdefault((uid, w.uuid), Account()).add(
                w.end, dt, min(u.busy, dt), allowed(min(share, 1.0)), u.free)
            if uid in exposed:
                self._bypass.setdefault((uid, w.uuid), Account()).add(
                    w.end, dt, min(u.past, dt), UNGATED_MIN, u.past)
        self._none.setdefault(w.uuid, Account()).add(w.end, dt, min(unclaimed, dt), MARGIN_MIN)

    def _compute(self, by_gpu: Mapping[str, list[JobLimits]],
                 memory: Mapping[str, Mapping[int, int]],
                 owner: Mapping[tuple[str, int], str | None]) -> list[Violation]:
        out: list[Violation] = []
        for uuid, jobs in by_gpu.items():
            def pid(job_id: str, uuid: str = uuid) -> int:
                return self._pid_of(job_id, uuid, memory, owner)
            mine = self._over_jobs(uuid, jobs, pid)
            out += mine
            named = {v.job_id for v in mine}
            for uid in {lim.uid for lim in jobs}:
                out += [v for v in self._over_user(uuid, uid, jobs, pid)
                        if v.job_id not in named]
                out += self._past_hooks(uuid, uid, jobs, pid)
            none = self._none.get(uuid)
            if none is not None and none.over:
                out.append(Violation(NO_JOB, uuid, self._busiest.get((None, uuid), 0), None,
                                     none.share(), 0.0, share_unit=True))
        return out

    def _over_jobs(self, uuid: str, jobs: list[JobLimits],
                   pid: Callable[[str], int]) -> list[Violation]:
        """The jobs on the GPU over their own budgets."""
        out = []
        for lim in jobs:
            key = (lim.job_id, uuid)
            use = self._jobs.get(key)
            if use is not None and use.over:
                at = use.recent[-1][0] if use.recent else 0.0
                out.append(Violation(COMPUTE, uuid, pid(lim.job_id), lim.job_id, use.share(),
                                     self._share_in_force(key, at), share_unit=True,
                                     burst=use.burst, borrows=lim.borrows))
        return out

    def _over_user(self, uuid: str, uid: int, jobs: list[JobLimits],
                   pid: Callable[[str], int]) -> list[Violation]:
        """A user's jobs on the GPU over their budget together: each of them
        over its own share, else the busiest."""
        use = self._users.get((uid, uuid))
        if use is None or not use.over:
            return []
        mine = [lim for lim in jobs if lim.uid == uid]
        shares = sum(self._share_in_force((lim.job_id, uuid), use.recent[-1][0])
                     for lim in mine) if use.recent else 0.0
        over = [lim for lim in mine
                if (r := self._raw.get((lim.job_id, uuid))) is not None and r.debt > 0]
        if not over:
            over = sorted(mine, key=lambda lim: -self._jobs[(lim.job_id, uuid)].share()
                          if (lim.job_id, uuid) in self._jobs else 0.0)[:1]
        return [Violation(COMPUTE, uuid, pid(lim.job_id), lim.job_id, use.share(),
                          min(shares, 1.0), scope=USER, uid=uid, share_unit=True,
                          burst=use.burst) for lim in over]

    def _past_hooks(self, uuid: str, uid: int, jobs: list[JobLimits],
                    pid: Callable[[str], int]) -> list[Violation]:
        """A user's work past their hooks, where another user's job has a
        turn: each of the user's jobs that ran some lately."""
        use = self._bypass.get((uid, uuid))
        if use is None or not use.over or not use.recent:
            return []
        since = use.recent[-1][0] - SHOWN_S
        return [Violation(COMPUTE, uuid, pid(lim.job_id), lim.job_id, use.share(), 0.0,
                          scope=BYPASS, uid=uid, share_unit=True, burst=use.burst)
                for lim in jobs
                if lim.uid == uid and self._bypassed.get((lim.job_id, uuid), -1.0) >= since]

    def _pid_of(self, job: str, uuid: str, memory: Mapping[str, Mapping[int, int]],
                owner: Mapping[tuple[str, int], str | None]) -> int:
        """The job's busiest process in its last window on the GPU, else its
        largest holder of memory there, else 0."""
        pid = self._busiest.get((job, uuid))
        if pid:
            return pid
        procs = {p: b for p, b in memory.get(uuid, {}).items() if owner.get((uuid, p)) == job}
        return max(procs, key=lambda p: (procs[p], -p)) if procs else 0


def _memory(limits: list[JobLimits], memory: Mapping[str, Mapping[int, int]],
            owner: Mapping[tuple[str, int], str | None]) -> list[Violation]:
    """Processes in no job holding memory, and jobs over their limits (each
    named by its largest holder on the GPU)."""
    found = [Violation(NO_JOB, uuid, pid, None, float(used), 0.0)
             for uuid, procs in memory.items() for pid, used in procs.items()
             if owner.get((uuid, pid)) is None]
    for lim in limits:
        procs = {p: b for p, b in memory.get(lim.uuid, {}).items()
                 if owner.get((lim.uuid, p)) == lim.job_id}
        held = sum(procs.values())
        if procs and held > lim.mem_limit:
            pid = max(procs, key=lambda p: (procs[p], -p))
            found.append(Violation(MEMORY, lim.uuid, pid, lim.job_id, float(held),
                                   float(lim.mem_limit)))
    return found


def _strays(limits: list[JobLimits], memory: Mapping[str, Mapping[int, int]],
            windows: list[ProcWindow],
            owner: Mapping[tuple[str, int], str | None]) -> list[JobLimits]:
    """Limits of zero for each job seen on a GPU it was not given (a process
    of it that walked past CUDA_VISIBLE_DEVICES): no memory, no share."""
    given = {(lim.job_id, lim.uuid) for lim in limits}
    uids = {lim.job_id: lim.uid for lim in limits}
    seen = {(uuid, pid) for uuid, procs in memory.items() for pid in procs}
    seen |= {(w.uuid, pid) for w in windows for pid in w.busy}
    out: dict[tuple[str, str], JobLimits] = {}
    for uuid, pid in seen:
        job = owner.get((uuid, pid))
        if job is not None and job in uids and (job, uuid) not in given:
            out.setdefault((job, uuid), JobLimits(job, uuid, 0, 0.0, uids[job], given=False))
    return list(out.values())
