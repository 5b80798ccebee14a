"""Whose the device's busy time is (docs/compute.md, "What NVML says, and
how it is read"): each GPU's busy window from NVML's device samples, split
between what the jobs' hooks claim (their own measure of their GPU time)
and what stays beyond the claims, which goes to the processes on the GPU
that loaded no hook (or, where one job alone has processes there, to it).
The violation watch (vgpuctl.daemon.watch) hands each window's split
to the rules.

The claims and the device's busy time are set against each other run by
run, not window by window (the constants below); a job's counter that
claims more than the device ran is believed only as far as its own turn.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vgpuctl.core.violations import ProcWindow
from vgpuctl.system.nvml import GpuStats

if TYPE_CHECKING:
    from vgpuctl.daemon.watch import Known

log = logging.getLogger("vgpuctl.daemon")

Busy = Callable[[str], Any]   # uuid -> a vgpuctl.system.busy.BusyWindow (or None)

# Window by window the hooks' claims and the device's busy time differ; over
# a run they agree. The claims lag: a hook claims a span once it sees it done
# (at its next launch, up to a cycle of turns of 50 ms later). The device's
# busy time lags more: NVML's samples come a sample period (1/6 s) after the
# time they cover. What the device ran beyond the claims is carried from
# window to window: only what stays beyond CLAIM_BEHIND_S is the unhooked
# processes' (or a lone job's: one of its processes passes for hooked and
# launches past its hook), and claims ahead of the device by more than
# CLAIM_AHEAD_S are a lie.
CLAIM_BEHIND_S = 0.1
CLAIM_AHEAD_S = 0.25
# A job's claims on a GPU are believed while it has a process there, and this
# long after (its last spans are claimed as its last process exits, when
# NVML may have dropped it already); a job that never had one there ran
# nothing there, whatever its counter says. For as long after a job left a
# GPU, the device's busy time beyond the claims is no lone job's (it is the
# one that left: its last claims were never read, its busy time comes later).
CLAIM_AFTER_S = 1.0


class BusySplit:
    """Each tick's windows; between ticks, what it carries: each job's
    counter at the last window, each GPU's busy time no claim has matched
    yet, and when each job was last listed on each GPU."""

    def __init__(self, busy: Busy | None) -> None:
        self._busy = busy
        self.claim_pids: set[int] = set()   # the pids claims were put on, last tick
        self.beyond: dict[tuple[str, int], float] = {}   # (uuid, pid) -> busy beyond the claims
        self._claimed: dict[tuple[str, str], int] = {}   # each job's counter at the last window
        # per GPU: the busy time no claim has matched yet (< 0: claims ahead)
        self._carry: dict[str, float] = {}
        # (job, uuid) -> when a process of the job was last listed there;
        # per GPU, the jobs listed there and when one last left
        self._present: dict[tuple[str, str], float] = {}
        self._here: dict[str, frozenset[str]] = {}
        self._left: dict[str, float] = {}

    def windows(self, stats: list[GpuStats], known: Known,
                 owner: dict[tuple[str, int], str | None], mono: float) -> list[ProcWindow]:
        """Each GPU's new busy window, split: each job's claim (its hooks'
        GPU time since the previous window) to one of its processes, what
        the device ran beyond the claims to the processes on it that loaded
        no hook (the module's docstring). A job's claim goes to its process
        NVML lists there, else to a pid of its own (owner is told)."""
        self.claim_pids = set()
        self.beyond = {}
        if self._busy is None:
            return []
        out = []
        for s in stats:
            try:
                w = self._busy(s.uuid)
            except Exception as e:  # noqa: BLE001 - a sampling error skips this GPU
                log.debug("busy time of %s: %s", s.uuid, e)
                continue
            if w is None or w.duration_s <= 0:
                continue
            here = frozenset(j for p in s.processes if (j := owner.get((s.uuid, p))) is not None)
            for j in here:
                self._present[(j, s.uuid)] = mono
            if self._here.get(s.uuid, here) - here:
                self._left[s.uuid] = mono
            self._here[s.uuid] = here
            claims, beyond = self._match(s, w, known, owner, mono)
            busy: dict[int, float] = {}
            for (_, pid), c in claims.items():
                self.claim_pids.add(pid)
                busy[pid] = busy.get(pid, 0.0) + c
            free = self._unhooked(s, known, owner,
                                  lone=mono - self._left.get(s.uuid, -math.inf) > CLAIM_AFTER_S
                                  ) if beyond > 0 else []
            for p in free:
                busy[p] = busy.get(p, 0.0) + beyond / len(free)
                self.beyond[(s.uuid, p)] = beyond / len(free)
            out.append(ProcWindow(s.uuid, w.start_s, w.end_s, busy))
        live = {(lim.job_id, lim.uuid) for lim in known.limits}
        for key in [k for k in self._claimed if k not in live]:
            del self._claimed[key]
        for key in [k for k, t in self._present.items() if mono - t > CLAIM_AFTER_S]:
            del self._present[key]
        return out

    def _match(self, s: GpuStats, w: Any, known: Known,
               owner: dict[tuple[str, int], str | None], mono: float
               ) -> tuple[dict[tuple[str, int], float], float]:
        """The claims believed in this window, and the busy time that stays
        beyond them (the module's docstring)."""
        claims = self._claims(s, w, known, owner, mono)
        before = self._carry.get(s.uuid, 0.0)
        carry = before + w.busy_s - sum(claims.values())
        if carry < -CLAIM_AHEAD_S:
            # More is claimed than the device ran, beyond any lag: a job's
            # counter (its own to write) lies. Claims are then believed only
            # as far as the claimant's own turn goes, so that a lie can hide
            # no one's busy time; beyond its turn it is nobody's.
            turns = {lim.job_id: lim.turn for lim in known.limits if lim.uuid == s.uuid}
            claims = {(j, p): min(c, turns.get(j, 0.0) * w.duration_s)
                      for (j, p), c in claims.items()}
            carry = max(-CLAIM_AHEAD_S, before + w.busy_s - sum(claims.values()))
        beyond = max(0.0, carry - CLAIM_BEHIND_S)
        self._carry[s.uuid] = carry - beyond
        return claims, beyond

    def _claims(self, s: GpuStats, w: Any, known: Known,
                owner: dict[tuple[str, int], str | None],
                mono: float) -> dict[tuple[str, int], float]:
        """(job, the pid it is put on) -> the GPU time its hooks claim on the
        GPU since the last window, as far as it is believed."""
        claims: dict[tuple[str, int], float] = {}
        for lim in known.limits:
            if lim.uuid != s.uuid:
                continue
            key = (lim.job_id, s.uuid)
            now_ns = known.claims.get(key, 0)
            new = max(0, now_ns - self._claimed.get(key, now_ns)) / 1e9
            self._claimed[key] = now_ns
            # (a job with no process on the GPU ran nothing there, whatever
            # its counter says: CLAIM_AFTER_S)
            if new > 0.0 and mono - self._present.get(key, -math.inf) <= CLAIM_AFTER_S:
                pid = self._pid_for(lim.job_id, s, known, owner)
                claims[(lim.job_id, pid)] = min(new, w.duration_s)
        return claims

    def _unhooked(self, s: GpuStats, known: Known,
                  owner: dict[tuple[str, int], str | None], lone: bool) -> list[int]:
        """Whose the busy time beyond the claims is: the processes on the GPU
        that loaded no hook, or whose job was not given the GPU; else, where
        one job alone has processes there (and has for CLAIM_AFTER_S: lone),
        that job's (ungated alone, or a process that passes for hooked)."""
        given = {lim.job_id for lim in known.limits if lim.uuid == s.uuid}
        free = [p for p in s.processes
                if (known.hooked is not None and p not in known.hooked)
                or (owner.get((s.uuid, p)) or "") not in given]
        if free:
            return free
        jobs_here = {owner.get((s.uuid, p)) for p in s.processes} - {None}
        if len(jobs_here) == 1 and lone:
            return [self._pid_for(jobs_here.pop(), s, known, owner, hooked_only=False)]
        return []

    @staticmethod
    def _pid_for(job_id: str, s: GpuStats, known: Known,
                 owner: dict[tuple[str, int], str | None], hooked_only: bool = True) -> int:
        mine = [p for p in s.processes if owner.get((s.uuid, p)) == job_id
                and (not hooked_only or known.hooked is None or p in known.hooked)]
        if mine:
            return max(mine, key=lambda p: s.processes[p])
        procs = known.jobs.get(job_id)
        # a pid of its own, else a stand-in no process has (one per job)
        pid = min(procs.seeds) if procs is not None and procs.seeds else \
            -1 - sum(job_id.encode()) * 7919 % 1_000_000_007
        owner[(s.uuid, pid)] = job_id
        return pid

    # -- attribution ---------------------------------------------------------------
