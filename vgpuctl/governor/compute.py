"""Compute isolation: turns each job's ``--core`` share into the refill rate
of the hook's token bucket, from NVML's per-process utilization.

The daemon calls `ComputeGovernor.tick` every tick (~100 ms) with every job
on every GPU and writes each returned `Gate` into the job's region. The
arithmetic lives in `vgpuctl.core.controller` (pure); NVML reading in
`vgpuctl.governor.sampler`; whose busy time a window's is, where NVML does
not say, in `vgpuctl.core.attribution`; this module is the thin layer
between them. See docs/compute.md.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from vgpuctl.core import attribution
from vgpuctl.core import controller as ctl
from vgpuctl.errors import NvmlUnavailable
from vgpuctl.governor.sampler import Sampler, Window

log = logging.getLogger(__name__)

# A job that launched nothing for this long lends its share (soft policy).
IDLE_S = 0.3
# The launch counters come from the job's usage region, which the job can
# write: no process launches faster than this (a launch costs microseconds of
# driver time), so more in a tick is a lie and is clamped.
MAX_LAUNCH_RATE = 2_000_000
# A job first seen this soon after its region was made has its history
# start at the region's making (_start_history).
START_HISTORY_S = 1.0
# Evidence for a job's cost: each window whose busy time was its own counts
# in proportion to the job's share of it, fully from OWN_SHARE (NVML's whole
# percents are then a small part of it); certainty 1 - e^(-2 x evidence).
# It fades with this half-life (its kernels may change), faster while the
# claims miss the device's busy time by more than DRIFT (a share of them).
OWN_SHARE = 0.1
CERTAIN_HALFLIFE_S = 300.0
DRIFT = 0.1
DRIFT_WEIGHT = 0.1      # of a window in the running miss
DRIFT_FORGET = 0.5
# Probes (where NVML names one process a period, two to MAX_PROBED jobs are
# active on the GPU, and one's cost is uncertain): the others are held for a
# whole sample period, so that it runs alone and its cost is learnt as its
# own; from LEAD_S before a period starts (for queued work to end); then
# none on the GPU for PROBE_GAP periods (the windows after it tell the
# costs of the others).
LEAD_S = 0.05
SETTLE_S = 0.2          # a job gated or let go is steady again after this
POOL = 0.1              # costs this close are the same cost
PROBE_GAP = 6.0
PROBE_GAP_MANY = 1.0    # ...or this, while two or more others are uncertain
PROBE_AFTER = 3.0       # periods a job is gated before it may be probed...
PROBE_ALONE_AFTER = 12.0  # ...or, the only uncertain one, before it is (its part
                        # too small to learn its cost from the rest)
PROBE_ALONE_MAX_S = 4.0   # (at most this long: a job's launch history keeps 5 s)
PROBE_PERIODS = 1       # periods a probe lasts
# A part left by the others' claims is a job's cost only this many sample
# periods after any hold there ended (what the jobs held had queued runs
# then, and the GPU is full), and while none makes up a hold.
RESIDUAL_CALM = 3.0
MAKE_UP_S = 3.0         # a job held for a probe makes it up within this, with
                        # GPU time no share claims
MAX_PROBED = 4
# A job's state is kept this long after it ended (the watch's window of the
# tick may still hold some of its busy time).
GONE_S = 2.0



@dataclass
class JobDevice:
    """One job on one GPU at this tick."""

    job_id: str
    uuid: str                   # physical GPU UUID
    pids: frozenset[int]        # every live pid of the job
    core_share: int             # percent 1..100
    policy: str                 # "hard" | "soft"
    launches: int               # region usage.dev[i].launches (cumulative)
    promised: bool = True       # its share is a promise (asked for; normal or high)
    created: float | None = None  # wall time the job's region was made, gated
                                  # (initial_gate), with no launch counted yet
    program: str | None = None  # its user and command line: jobs of one program
                                # are taken to cost alike (None: a program of its own)
    high: bool = False          # of the high class: never held for a probe


@dataclass
class Gate:
    """What the daemon writes into the job's region for that GPU."""

    throttle: bool
    refill_rate: int            # tokens per second
    bucket_size: int            # tokens
    measured: float             # measured share 0..1 over the last window
    target: float = 0.0         # effective target share 0..1 this tick: above
                                # core_share when a soft job borrows, a little
                                # below on a fully subscribed GPU


@dataclass
class _State:
    loop: ctl.ShareLoop = field(default_factory=ctl.ShareLoop)
    history: ctl.LaunchHistory = field(default_factory=ctl.LaunchHistory)
    last_launches: int | None = None
    count: float = 0.0          # launches seen, sanitised (monotonic, rate-clamped)
    last_now: float | None = None
    last_active: float | None = None
    measured: float = 0.0
    pids: frozenset[int] = frozenset()
    own: float = 0.0            # evidence from windows whose busy time was its own...
    own_busy: float = 0.0       # ...their busy seconds and launches (faded alike): the
    own_launches: float = 0.0   # cost per launch they show
    own_at: float | None = None  # ...decayed from this wall time
    held_from: float = 0.0      # wall times: held for a probe from...
    held_until: float | None = None  # ...until
    held_end: float = 0.0       # ...when the last hold ended
    pinned_from: float = 0.0    # wall times: the job probed runs at its gate of
    pinned_until: float | None = None  # the probe's start from... until
    gate: Gate | None = None    # its gate of the last tick
    program: str | None = None  # JobDevice.program
    high: bool = False          # JobDevice.high


def initial_gate(core_share: int, policy: str, gains: ctl.Gains | None = None,
                 scale: int | None = None) -> Gate:
    """The gate a new job's region is made with, before the governor has
    seen it: its share at the cautious rate the governor starts it at
    (controller.step before a cost estimate), so that it is paced from its
    first launch; no gate for a hard 100 %. docs/compute.md, start-up."""
    gains = gains or ctl.Gains()
    scale = scale or _token_scale()
    share = min(max(core_share, 1), 100) / 100.0
    if share >= ctl.FULL:
        return Gate(False, 0, 0, 0.0, share)
    cmd = ctl.step(ctl.ShareLoop(), ctl.Observation(target=share, dt=0.0, launches=0.0), gains)
    return Gate(True, ctl.to_tokens(cmd.rate, scale), ctl.to_tokens(cmd.bucket, scale), 0.0,
                share)


def _token_scale() -> int:
    try:
        from vgpuctl.system.region import const

        return const("VGPU_TOKEN_SCALE")
    except Exception:  # noqa: BLE001 - header not built: the documented value
        return 1000


class ComputeGovernor:
    """Sets every job's gate on every GPU, tick after tick.

    By default it opens NVML itself (the simulated one when ``VGPU_SIM`` is
    set). Tests pass ``nvml`` (a pynvml-like object) and ``clock_us``.
    """

    def __init__(self, tick_s: float = 0.1, gains: ctl.Gains | None = None,
                 nvml: Any = None, clock_us: Callable[[], int] | None = None) -> None:
        self.tick_s = tick_s
        self.gains = gains or ctl.Gains()
        self._owns_nvml = nvml is None
        if nvml is None:
            nvml = _open_nvml()
        self._nvml = nvml
        self._clock_us = clock_us or (lambda: time.time_ns() // 1000)
        self._sampler = Sampler(nvml, self._clock_us, follow_idle=True)
        self._states: dict[tuple[str, str], _State] = {}
        self._capacity: dict[str, ctl.Capacity] = {}
        self._scale = _token_scale()
        # Per GPU: its NVML splits busy time per process (seen once: a
        # one-period window listing two processes); the processes that
        # loaded the hook, and those on the GPU without it (the watch's).
        self._per_process: dict[str, bool] = {}
        self._hooked: frozenset[int] | None = None
        self._unhooked: dict[str, frozenset[int]] = {}
        self._one: dict[str, bool] = {}             # ...or names one process a period
        self._grid: dict[str, float] = {}           # a sample period's end (wall s)
        self._gone: dict[tuple[str, str], tuple[_State, float]] = {}   # ended: (state, when)
        # per GPU: the sample period a probe runs a job alone in (wall s):
        # the window before it, in which the others' queued work ended, is
        # not the job's alone
        self._probing: dict[str, float] = {}
        self._next_probe: dict[str, float] = {}     # no probe before (wall s)
        self._miss: dict[str, float] = {}           # running miss of the known costs (+ under)
        # each GPU's NVML window read this tick, split among the jobs (None:
        # none new)
        self.windows: dict[str, Window | None] = {}

    def close(self) -> None:
        if self._owns_nvml and self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception as e:  # noqa: BLE001 - closing: nothing to save
                log.debug("nvmlShutdown: %s", e)
        self._nvml = None

    def sample_period_s(self, uuid: str) -> float:
        """NVML's sample period on this GPU: how far measured shares trail
        the work."""
        return self._sampler.period_s(uuid)

    def wall_s(self) -> float:
        """The clock NVML's windows are on (seconds)."""
        return self._clock_us() / 1e6

    def last_shares(self, uuid: str) -> dict[int, float]:
        """Each pid's share of this GPU in the newest NVML window."""
        return self._sampler.last_shares(uuid)

    def note_processes(self, hooked: frozenset[int] | None,
                       unhooked: dict[str, frozenset[int]]) -> None:
        """From the violation watch: the pids that loaded the hook (in a slot
        of their job's region), and per GPU those on it without it."""
        self._hooked = hooked
        self._unhooked = dict(unhooked)

    def splits_per_process(self, uuid: str) -> bool:
        """Whether this GPU's NVML has been seen to split busy time per
        process (a one-period window listing two processes busy)."""
        return self._per_process.get(uuid, False)

    def attribute(self, uuid: str, window: Window | None) -> Window | None:
        """The window with each pid's busy time its own: NVML's split where
        it splits per process, else the device's busy time split by what
        the jobs' hooks account (vgpuctl.core.attribution)."""
        if window is None:
            return None
        return self._attribute(uuid, window, learn=False)[0]

    def split_window(self, uuid: str, window: Window) -> tuple[Window, bool]:
        """For the violation watch's windows, which it reads itself: the
        window attributed, and whether that split is settled (NVML splits
        per process, or every job that launched has a certain cost)."""
        w, _, settled = self._attribute(uuid, window, learn=False)
        return w, settled

    def _attribute(self, uuid: str, window: Window,
                   learn: bool) -> tuple[Window, frozenset[str], bool]:
        """The window attributed, the jobs whose busy time in it is NVML's
        own figure, and whether the split is settled."""
        if (not window.coarse and window.periods <= 1.5
                and sum(1 for b in window.busy_s.values() if b > 0) >= 2):
            self._per_process[uuid] = True      # one-process-a-period drivers never do
        d = window.duration_s
        claims: list[attribution.Claim] = []
        # (with the jobs that ended since the window began: it holds some of
        # their busy time too)
        states = {k: st for k, st in self._states.items() if k[1] == uuid}
        for k, (st, gone_at) in self._gone.items():
            if k[1] == uuid and k not in states and window.start_s < gone_at:
                states[k] = st
        pooled = _pooled_costs({k[0]: st for k, st in states.items()})
        certainty = _group_certainty(states, pooled, window.end_s)
        for (job_id, _), st in states.items():
            loop = st.loop
            launches = allowed = None
            if loop.rate is not None:
                # None where the window began before its gate counted its
                # launches (it ran unseen: as an ungated job)
                launches = st.history.between(window.start_s, window.end_s)
                allowed = loop.rate * d
            # (a cost not learnt from its own windows is not the job's: the
            # split would keep whatever its first windows gave it; unknown,
            # it claims at the known ones' cost, or all alike)
            cost = pooled.get(job_id)
            claims.append(attribution.Claim(job_id, st.pids, launches, cost,
                                            certainty[job_id], allowed))
        if (learn and not window.coarse and window.periods <= 1.5
                and sum(1 for b in window.busy_s.values() if b > 0) == 1
                and sum(1 for c in claims if (c.launches or 0) >= 3) >= 2):
            self._one[uuid] = True      # two jobs ran, one was named
        res = attribution.split(window.busy_s, d, claims, self._per_process.get(uuid, False),
                                self._hooked, self._unhooked.get(uuid, ()))
        # Learnt from steady windows only: no rate that counts jumped just
        # before (what a job launched then runs now, or what it launches now
        # runs later): the job's own, and where its part is the rest of the
        # others' claims, theirs.
        others_steady = all(states[(c.job_id, uuid)].loop.settle == 0
                            for c in claims if c.launches)
        if learn:
            live = sum(1 for k in self._states if k[1] == uuid)
            # a part left by the others is the job's once the queues a hold
            # or a making up left have run out: RESIDUAL_CALM periods after
            # every hold there, none making up
            period = self._sampler.period_s(uuid)
            calm_rest = all(
                window.start_s >= (st2 := states[(c.job_id, uuid)]).held_end
                + RESIDUAL_CALM * period and not st2.loop.owing
                for c in claims if (c.job_id, uuid) in states)
            for job_id in res.own:
                st = self._states.get((job_id, uuid))
                if (st is None or st.loop.rate is None or not st.history.points
                        or (res.split and not others_steady)
                        or (res.split and not calm_rest)
                        or window.start_s < st.history.points[0][0] + SETTLE_S
                        or window.start_s < st.held_end + SETTLE_S
                        or self._lead_in(uuid, window)):
                    # (just gated, or let go: what it launched before runs
                    # now, or what it launches now runs later; no steady cost)
                    continue
                n = st.history.between(window.start_s, window.end_s)
                if n and d > 0:
                    mine = sum(res.busy.get(p, 0.0) for p in st.pids)
                    was = _certainty(st, window.end_s)
                    st.own += min(1.0, mine / d / OWN_SHARE)
                    st.own_busy += mine
                    st.own_launches += n
                    log.debug("job %s on %s ran alone %.3f-%.3f: %.1f ms in %.1f launches",
                              job_id, uuid, window.start_s, window.end_s, 1000 * mine, n)
                    if live > 1:
                        _adopt(st, was, window.end_s)
            miss = self._miss.get(uuid, 0.0)
            calm = others_steady and all(
                (st := states[(c.job_id, uuid)]).held_until is None
                and window.start_s >= st.held_end + SETTLE_S for c in claims)
            if res.split and calm:
                miss += DRIFT_WEIGHT * (res.off - miss)
                self._miss[uuid] = miss
            if abs(miss) > DRIFT:
                log.debug("costs on %s miss by %+.0f %%: learnt again", uuid, 100 * miss)
                self._miss[uuid] = 0.0
                # The costs no longer add up to what the device ran: some
                # job's kernels changed. Its cost is to be learnt again.
                for c in claims:
                    st = self._states.get((c.job_id, uuid))
                    if st is not None and c.launches:
                        st.own *= DRIFT_FORGET
                        st.own_busy *= DRIFT_FORGET
                        st.own_launches *= DRIFT_FORGET
        settled = (self._per_process.get(uuid, False) or not res.split
                   or all(c.cost is not None and c.certainty >= attribution.CERTAIN
                          for c in claims if c.launches))
        if not res.split:
            return window, res.own, settled
        low = None
        if window.low_s is not None:
            hi, lo = sum(window.busy_s.values()), sum(window.low_s.values())
            f = lo / hi if hi > 0 else 0.0
            low = {p: b * f for p, b in res.busy.items()}
        return replace(window, busy_s=res.busy, low_s=low), res.own, settled

    def _unsure(self, uuid: str, wall_s: float) -> set[tuple[str, str]]:
        """The jobs on the GPU whose cost is uncertain: neither learnt from
        windows of their own nor from a job of their program's."""
        states = {k: st for k, st in self._states.items() if k[1] == uuid}
        pooled = _pooled_costs({k[0]: st for k, st in states.items()})
        certainty = _group_certainty(states, pooled, wall_s)
        return {k for k in states if certainty[k[0]] < attribution.CERTAIN}

    def _lead_in(self, uuid: str, window: Window) -> bool:
        """The window ends in a probe's lead-in: the jobs held have launched
        nothing since a little before it, but what they had queued may have
        run in it; it is nobody's alone."""
        start = self._probing.get(uuid)
        if start is None:
            return False
        period = self._sampler.period_s(uuid)
        return start - period - LEAD_S - 2 * self.tick_s < window.end_s < start + 0.25 * period

    def tick(self, jobs: list[JobDevice], now: float,
             gpus: Iterable[str] = ()) -> dict[tuple[str, str], Gate]:
        """One control step for every (job, GPU); returns the gate of each,
        keyed by (job_id, uuid). ``gpus``: the node's GPUs, read also while
        no job runs on them, so that NVML's first window holding a new job's
        launches is one sample period, not all since the last job (its first
        cost comes from it: docs/compute.md, start-up)."""
        wall_s = self._clock_us() / 1e6
        by_gpu: dict[str, list[JobDevice]] = {}
        for j in jobs:
            by_gpu.setdefault(j.uuid, []).append(j)
        out: dict[tuple[str, str], Gate] = {}
        self.windows = {}
        for uuid, group in by_gpu.items():
            window = self._sampler.read(uuid)
            self.windows[uuid] = window
            for j in group:
                st = self._states.setdefault((j.job_id, j.uuid), _State())
                st.pids, st.program, st.high = j.pids, j.program, j.high
            out.update(self._tick_gpu(group, window, now, wall_s))
        gang(out)
        watched = set(gpus)
        for uuid in watched - by_gpu.keys():
            self._sampler.read(uuid)        # only to keep its baseline current
        live = set(out)
        for key in [k for k in self._states if k not in live]:
            self._gone[key] = (self._states.pop(key), wall_s)
        for key in [k for k, (_, t) in self._gone.items() if wall_s - t > GONE_S]:
            del self._gone[key]
        for uuid in list(self._capacity):
            if uuid not in by_gpu:
                self._capacity.pop(uuid, None)
                self._per_process.pop(uuid, None)
                self._grid.pop(uuid, None)
                self._one.pop(uuid, None)
                self._miss.pop(uuid, None)
                self._next_probe.pop(uuid, None)
                self._probing.pop(uuid, None)
        for uuid in self._sampler.gpus():
            if uuid not in by_gpu and uuid not in watched:
                self._sampler.forget(uuid)
        return out

    def _tick_gpu(self, group: list[JobDevice], window: Window | None, now: float,
                  wall_s: float) -> dict[tuple[str, str], Gate]:
        """One step for the jobs of one GPU, given its new NVML window."""
        uuid = group[0].uuid
        seen = [self._observe(j, window, now, wall_s) for j in group]
        if window is not None:
            self._grid[uuid] = window.end_s
            # Whose busy time it was, where NVML's entries don't say.
            attributed, _, _ = self._attribute(uuid, window, learn=True)
            if attributed is not window:
                window = attributed
                self.windows[uuid] = window
                seen = [(c, self._remeasure(j, o, window))
                        for j, (c, o) in zip(group, seen, strict=True)]
        capacity = self._capacity.setdefault(uuid, ctl.Capacity())
        if window is not None and window.duration_s > 0 and not window.coarse:
            util = sum(window.busy_s.values()) / window.duration_s
            capacity.observe(util, any(self._held_back(c, o) for c, o in seen),
                             window.duration_s)
        targets = ctl.class_targets([c for c, _ in seen], capacity.value)
        # (what a probe's hold cost a job is made up once every cost there is
        # known: making it up earlier fills the GPU, and a cost can't be
        # learnt from the rest of a full GPU)
        unsure = self._unsure(uuid, wall_s)
        learning = not self._per_process.get(uuid, False) and any(
            c.active and self._states[c.key].loop.rate is not None and c.key in unsure
            for c, _ in seen)
        room = ctl.start_room([c for c, _ in seen], targets, capacity.value,
                              [c.key for c, _ in seen if self._states[c.key].loop.catching_up
                               and not (learning and self._states[c.key].loop.catch_until)])
        gates: dict[tuple[str, str], Gate] = {}
        for claim, o in seen:
            key = claim.key
            st = self._states[key]
            target = targets[key]
            if st.pinned_until is not None and wall_s >= st.pinned_until:
                st.pinned_until = None
            if (st.pinned_until is not None and wall_s >= st.pinned_from - self.tick_s
                    and st.gate is not None and st.gate.throttle
                    and target >= ctl.FULL):
                # probed, and the others' hold would let it go (a soft job
                # alone is not gated): it stays gated as it was, its
                # launches counted, so that the probe learns its cost
                gates[key] = st.gate
                continue
            cap = room.get(key, 0.0 if st.loop.catching_up else None)
            cmd = ctl.step(st.loop, replace(o, target=target, owed_cap=cap), self.gains)
            if cmd.throttle:
                rate = min(ctl.to_tokens(cmd.rate, self._scale), 2**62)
                bucket = min(ctl.to_tokens(cmd.bucket, self._scale), 2**62)
                gates[key] = Gate(True, rate, bucket, st.measured, target)
            else:
                gates[key] = Gate(False, 0, 0, st.measured, target)
                # The hook's fast path does not count launches in the
                # region's device counter: a window that overlaps ungated
                # time has launches missing, so none of it may feed the cost.
                st.history.points.clear()
        self._probe(uuid, [c for c, _ in seen], gates, wall_s, unsure)
        for key, g in gates.items():
            if self._states[key].pinned_until is None:
                self._states[key].gate = g
        return gates

    def _probe(self, uuid: str, claims: list[ctl.Claim],
               gates: dict[tuple[str, str], Gate], wall_s: float,
               uncertain: set[tuple[str, str]]) -> None:
        """Where NVML names one process a sample period and a gated job's
        cost is uncertain beside others (two to MAX_PROBED active), hold the
        others for a whole sample period (docs/compute.md, probes): its busy
        time is then its own. Holds the gates of the jobs held (one launch
        at most, then none) until the period is over. uncertain: the jobs
        there whose cost is uncertain (_unsure, this tick)."""
        for key, g in gates.items():
            st = self._states[key]
            if st.held_until is not None and wall_s >= st.held_until:
                st.held_until = None
                st.held_end = wall_s
                ctl.catch_up_after(st.loop, MAKE_UP_S)
            # held from the last tick before held_from (the next is too late)
            if (st.held_until is not None and wall_s >= st.held_from - self.tick_s
                    and g.throttle):
                gates[key] = Gate(True, 1, self._scale, g.measured, g.target)
        if (self._per_process.get(uuid, False) or not self._one.get(uuid, False)
                or wall_s < self._next_probe.get(uuid, 0.0)):
            return
        period = self._sampler.period_s(uuid)
        active = [c for c in claims
                  if self._states[c.key].loop.rate is not None
                  and (self._states[c.key].history.between(wall_s - IDLE_S, wall_s) or 0) > 0]
        if any(self._states[c.key].high for c in active):
            # a latency-sensitive job is never held a sample period: the
            # costs there stay a guess while it runs (docs/compute.md)
            return
        if any(c.active and c not in active for c in claims):
            # a job there runs ungated (a soft one lent the GPU), or has not
            # launched yet (it may start any moment): no hold would leave
            # another alone
            return
        # (a job gated for a few periods only may learn its cost from the rest
        # of the others' first: a probe holds them)
        unsure = [c for c in active
                  if c.key in uncertain
                  and self._states[c.key].history.points
                  and self._states[c.key].history.points[0][0] <= wall_s - PROBE_AFTER * period]
        grid = self._grid.get(uuid)
        programs = {self._states[c.key].program or c.key for c in unsure}
        if len(programs) == 1 and all(c in unsure for c in active):
            # every job there is of one program: they cost alike, as the
            # split takes them to
            return
        if len(programs) == 1 and min(_first_launch(self._states[c.key]) for c in unsure) > (
                wall_s - min(PROBE_ALONE_AFTER * period, PROBE_ALONE_MAX_S)):
            # one uncertain program beside known costs: it learns its cost
            # from the rest, unless its part is too small for that
            return
        if not unsure or not 2 <= len(active) <= MAX_PROBED or grid is None:
            return
        # The first period that starts more than two ticks and LEAD_S from
        # now: the hold is in place LEAD_S and a tick before it (the launch
        # counts of the tick before it are then those of the held GPU), and
        # its end.
        k = math.ceil((wall_s + 2 * self.tick_s + LEAD_S - grid) / period)
        start = grid + k * period
        until = start + PROBE_PERIODS * period + LEAD_S
        target = max(unsure, key=lambda c: (c.share, str(c.key)))
        for c in active:
            st = self._states[c.key]
            if c is target:
                st.pinned_from, st.pinned_until = start - LEAD_S - self.tick_s, until
                continue
            st.held_from, st.held_until = start - LEAD_S - self.tick_s, until
            ctl.hold_begins(st.loop)
        # (while two or more others are uncertain, none of them can learn its
        # cost from the rest: the next probe comes as soon as the windows
        # after this one are steady)
        gap = PROBE_GAP if len(programs) <= 2 else PROBE_GAP_MANY
        self._next_probe[uuid] = until + gap * period
        self._probing[uuid] = start
        log.debug("probe on %s: %s runs, %s held until %.3f", uuid, target.key[0],
                  [c.key[0] for c in active if c is not target], until)

    def _observe(self, j: JobDevice, window: Window | None, now: float,
                 wall_s: float) -> tuple[ctl.Claim, ctl.Observation]:
        """Update one job's bookkeeping; its claim for the policy and its
        observation for the loop (target filled in later)."""
        key = (j.job_id, j.uuid)
        st = self._states.setdefault(key, _State())
        dt = now - st.last_now if st.last_now is not None else self.tick_s
        if dt <= 0:
            dt = self.tick_s
        # The region's counter is the job's to write: a step back (or the
        # first look) counts nothing, a step beyond any possible rate counts
        # that rate.
        if st.last_launches is None:
            launched = _first_launches(j, wall_s)
        elif j.launches < st.last_launches:
            launched = 0
        else:
            launched = min(j.launches - st.last_launches, int(MAX_LAUNCH_RATE * dt) + 1)
        first = st.last_launches is None
        st.last_launches = j.launches
        st.last_now = now
        st.count += launched
        if first:
            _start_history(st, j, wall_s)
        elif st.loop.rate is not None:     # gated since the last tick
            st.history.add(wall_s, st.count)

        measured = measured_low = busy = window_launches = window_s = None
        if window is not None:
            measured = min(sum(window.share(p) for p in j.pids), 1.0)
            window_s = window.duration_s
            if window.coarse:
                # Several sample periods in one read: the share is known only
                # between bounds, and the busy time is no base for the cost.
                measured_low = min(sum(window.share_low(p) for p in j.pids), measured)
            else:
                busy = sum(window.busy_s.get(p, 0.0) for p in j.pids)
            window_launches = st.history.between(window.start_s, window.end_s)
            if (window_launches is None and st.loop.rate is not None
                    and abs(window.end_s - wall_s) > 5.0 and abs(window_s - dt) < 0.5 * dt):
                # NVML's timestamps are not on this host's wall clock: take
                # the tick's launches for the window's.
                window_launches = float(launched)
            st.measured = measured
        # Active: it launched (the region counts gated launches only), or
        # NVML saw it run; an ungated job is taken to run on while its last
        # measurement says so (with a 1 s sample period, that can be ten
        # ticks old).
        if (launched > 0 or (measured or 0.0) > 0.005 or st.last_active is None
                or (st.loop.rate is None and st.measured > 0.005)):
            st.last_active = now
        loop = st.loop
        share = min(max(j.core_share, 1), 100) / 100.0
        claim = ctl.Claim(
            key, share,
            policy=j.policy if j.policy in ctl.POLICIES else ctl.HARD,
            active=now - st.last_active <= IDLE_S,
            # the bucket held it back, it runs ungated, or it uses its share
            wants_more=(loop.rate is None or loop.backlogged
                        or st.measured >= 0.9 * min(share, loop.target or share)),
            promised=j.promised)
        obs = ctl.Observation(target=share, dt=dt, launches=float(launched), measured=measured,
                              busy_s=busy, window_launches=window_launches, window_s=window_s,
                              measured_low=measured_low)
        return claim, obs

    def _remeasure(self, j: JobDevice, obs: ctl.Observation,
                   window: Window) -> ctl.Observation:
        """The job's observation from the attributed window."""
        st = self._states[(j.job_id, j.uuid)]
        measured = min(sum(window.share(p) for p in j.pids), 1.0)
        low = busy = None
        if window.coarse:
            low = min(sum(window.share_low(p) for p in j.pids), measured)
        else:
            busy = sum(window.busy_s.get(p, 0.0) for p in j.pids)
        st.measured = measured
        return replace(obs, measured=measured, measured_low=low, busy_s=busy)

    def _held_back(self, claim: ctl.Claim, obs: ctl.Observation) -> bool:
        """Held back by the device: gated, active, below its target, and not
        using what its bucket allows."""
        loop = self._states[claim.key].loop
        return (claim.active and obs.measured is not None and loop.rate is not None
                and loop.target is not None and obs.measured < 0.98 * loop.target
                and not loop.backlogged)


def gang(gates: dict[tuple[str, str], Gate]) -> None:
    """One decision for all the GPUs of a job (in place): a job on several
    GPUs is gated on each at the same rate, the lowest its GPUs' loops ask
    for, with the same bucket; ungated only where every one of its GPUs
    would be. Its ranks launch the same kernels between collectives, and a
    rank that runs ahead of the others spins in the next collective, busy
    to NVML without doing anything: gated apart, the rank ahead shows more
    than its share, its rate is cut, it falls behind, and the others spin
    in turn, until all crawl (docs/compute.md, "Jobs on several GPUs").
    Each GPU's loop keeps its own rate: the launches a lower gate held back
    are then launches it allowed and the job did not use, which stops its
    PI from pushing up while another GPU holds the job."""
    by_job: dict[str, list[tuple[str, str]]] = {}
    for key in gates:
        by_job.setdefault(key[0], []).append(key)
    for keys in by_job.values():
        if len(keys) < 2:
            continue
        gated = [gates[k] for k in keys if gates[k].throttle]
        if not gated:
            continue
        rate = min(g.refill_rate for g in gated)
        bucket = min(g.bucket_size for g in gated)
        for k in keys:
            gates[k] = replace(gates[k], throttle=True, refill_rate=rate, bucket_size=bucket)


def _fresh(j: JobDevice, wall_s: float) -> bool:
    """The job's region was made moments ago (gated, initial_gate), not left
    by a previous daemon: everything its counter holds was launched since."""
    return j.created is not None and 0.0 < wall_s - j.created <= START_HISTORY_S


def _first_launches(j: JobDevice, wall_s: float) -> int:
    """What a job seen for the first time launched before: its launches
    since its fresh region was made (its life has begun), else none known."""
    if not _fresh(j, wall_s):
        return 0
    return max(0, min(j.launches, int(MAX_LAUNCH_RATE * (wall_s - j.created)) + 1))


def _start_history(st: _State, j: JobDevice, wall_s: float) -> None:
    """A job seen for the first time: its launch history starts now, so that
    the first NVML window holding its launches gives its first cost (it is
    gated from its region's creation, initial_gate, so the region counts
    every launch). Launches already counted came after its creation: the
    history starts there, at none, and was none before."""
    if _fresh(j, wall_s):
        # none before it either: a window that began before the region was
        # made (the GPU's periods are not the job's) holds only these
        st.history.add(j.created - START_HISTORY_S, 0.0)
        st.history.add(j.created, 0.0)
    st.history.add(wall_s, st.count)


def _first_launch(st: _State) -> float:
    """When the job's history first counts a launch (wall s; inf: none)."""
    return next((t for t, n in st.history.points if n > 0), math.inf)


def _group_certainty(states: dict[tuple[str, str], _State], pooled: dict[str, float],
                     now: float) -> dict[str, float]:
    """Each job's certainty of its cost (job_id -> 0..1); a job's program
    (its user and command line) shares its best: jobs of one program cost
    alike, so one probed or alone says what the others cost."""
    own = {k[0]: _certainty(st, now) for k, st in states.items()}
    best: dict[str, float] = {}
    for k, st in states.items():
        if st.program is not None and k[0] in pooled:
            best[st.program] = max(best.get(st.program, 0.0), own[k[0]])
    return {k[0]: max(own[k[0]], best.get(st.program, 0.0) if st.program else 0.0)
            for k, st in states.items()}


def _pooled_costs(states: dict[str, _State]) -> dict[str, float]:
    """Each job's cost per launch from the windows whose busy time was its
    own; jobs whose costs are within POOL of each other (what one or two
    windows of NVML's whole percents and of whole launches can tell apart)
    are taken to cost alike, their pooled cost. A job of no such window
    takes the cost of its program (JobDevice.program), where one of the
    program's jobs has one."""
    own = sorted((st.own_busy / st.own_launches, j, st) for j, st in states.items()
                 if st.own_launches > 0 and st.own_busy > 0)
    out: dict[str, float] = {}
    group: list[tuple[float, str, _State]] = []

    def close() -> None:
        if group:
            c = (sum(g[2].own_busy for g in group) / sum(g[2].own_launches for g in group))
            out.update({g[1]: c for g in group})
    for item in own:
        if group and item[0] > group[0][0] * (1.0 + POOL):
            close()
            group = []
        group.append(item)
    close()
    by_program: dict[str, list[float]] = {}
    for j, st in states.items():
        if st.program is not None and j in out:
            by_program.setdefault(st.program, []).append(out[j])
    for j, st in states.items():
        if j not in out and st.program in by_program:
            costs = by_program[st.program]
            out[j] = sum(costs) / len(costs)
    return out


def _adopt(st: _State, was: float, now: float) -> None:
    """A job's cost just became certain (its own windows): the loop's own
    estimate, from splits that rested on a guess until now, starts again
    from it, and its integral with it (otherwise the loop's average, which
    holds at least cost_min_launches launches, takes seconds to forget the
    guess for long kernels)."""
    if was >= attribution.CERTAIN or _certainty(st, now) < attribution.CERTAIN:
        return
    if st.own_launches <= 0 or st.own_busy <= 0:
        return
    cost = st.own_busy / st.own_launches
    loop = st.loop
    if loop.launch_sum > 0 and (loop.cost is None or abs(loop.cost - cost) > POOL * cost):
        loop.busy_sum = cost * loop.launch_sum
        loop.integral = 0.0


def _certainty(st: _State, now: float) -> float:
    """0..1: how much of a job's cost was learnt from windows whose busy time
    was its own; its evidence decayed to now."""
    if st.own_at is not None and now > st.own_at:
        fade = 0.5 ** ((now - st.own_at) / CERTAIN_HALFLIFE_S)
        st.own *= fade
        st.own_busy *= fade
        st.own_launches *= fade
    st.own_at = now if st.own_at is None else max(st.own_at, now)
    return 1.0 - math.exp(-2.0 * st.own)


def _open_nvml() -> Any:
    """Initialise NVML (the simulator's when VGPU_SIM is set)."""
    from vgpuctl.system import sim

    sim.use_in_process()
    try:
        import pynvml
    except ImportError as e:  # pragma: no cover - a dependency
        raise NvmlUnavailable(f"NVML bindings missing: {e}") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise NvmlUnavailable(f"NVML unavailable: {e}") from None
    return pynvml
