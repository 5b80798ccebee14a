"""The compute-share controller: plain functions and dataclasses, no I/O.

Every quantity is in share units (0..1 of one GPU's time), never in SM-count
scaled units, so the same gains hold on a 16-SM and on a 132-SM device.

One `ShareLoop` per job per GPU turns (target share, measured share, launches)
into a launch rate for the hook's token bucket:

- **cost per launch** `c`: GPU seconds one launch of this job takes, estimated
  as a ratio of two exponentially weighted sums, GPU-busy seconds over
  launches, each pair taken over the same time window. It does not depend on
  the rate, so the feed-forward `rate = target / c` lands on the target in one
  step for kernels of 10 us as well as of 10 ms.
- **PI correction** on the share error `target - measured`, added to the
  target in share units: it removes what the cost estimate cannot see
  (measurement bias, queueing). Anti-windup: the integral does not grow while
  the job launched fewer kernels than it was allowed (idle, busy on the host,
  or held back by the device), nor before the first cost estimate, and it is
  clamped. A measurement that only bounds the share (NVML averaged several
  sample periods in one read, and may have skipped the job's idle ones)
  moves it only by the error both bounds agree on.

`effective_targets` implements the two policies on one GPU: `hard` jobs get
their share and never more; `soft` jobs that want more share the capacity
that idle jobs leave, in proportion to their shares, and give it back as soon
as an owner launches again. `Capacity` learns how much of the GPU's time
kernels can fill when processes take turns, so that on a fully subscribed
GPU every job loses in proportion rather than the one with the shortest
kernels losing it all. See docs/compute.md.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

HARD = "hard"
SOFT = "soft"
POLICIES = (HARD, SOFT)

# A target at or above this is "the whole GPU": no gate at all.
FULL = 0.999


@dataclass(frozen=True)
class Gains:
    """Tuning of the share loop. All shares in 0..1, times in seconds."""

    kp: float = 0.1                 # proportional gain on the share error
    ki: float = 0.2                 # integral gain per measurement
    integral_limit: float = 0.25    # |integral| at most this x target (share units)
    cost_halflife_s: float = 0.4    # half-life of the cost-per-launch average
    cost_min_launches: float = 100.0  # ...but it always holds this many launches: a
                                    # job of a few launches per window (1 % of 1 ms
                                    # kernels) reads 0 or 1 or 2 % a window
    bucket_s: float = 0.03          # bucket holds this much time's worth of launches
    backlog_ratio: float = 0.85     # launched >= this x allowed in a step: the bucket
                                    # limits the job (it wants more)
    pi_usage_ratio: float = 0.7     # launched >= this x allowed over the window: the
                                    # PI may push the rate up (anti-windup below it)
    idle_ratio: float = 0.3         # launched < this x allowed: the job was idle
    coarse_share: float = 0.1       # below this target NVML's whole percents are a
                                    # coarse measure: the PI's gains shrink in
                                    # proportion (a 1 % job reads 0, 1 or 2 %)
    min_span_launches: float = 3.0  # launched/allowed is taken over steps that allow at
                                    # least this many launches (a 1 % job of 1 ms kernels
                                    # may launch once in a step, or not at all)
    initial_cost_s: float = 5e-3    # assumed GPU time per launch before any measurement: a
                                    # new job starts at target / this, at or below its share
                                    # for kernels up to this long (docs/compute.md, start-up)
    start_min_rate: float = 10.0    # ...but at least this many launches/s (a 1 % job of 1 ms
                                    # kernels), so that NVML sees a small share start
    catch_up_s: float = 0.4         # by this long after its first launch a new job has made
                                    # up what its cautious start left it short of its share
    catch_up_periods: float = 2.4   # ...or this many of NVML's sample periods, if longer
                                    # (1 s periods: the first cost comes after a second)
    catch_up_min_s: float = 0.1     # ...spread over at least this long
    resolution: float = 0.01        # smallest share NVML reports (1 %)
    min_rate: float = 1.0           # launches/s never below this (the job can make progress)
    settle_steps: int = 2           # measurements the PI ignores after a rate jump
    rate_jump: float = 0.1          # a rate change this large (relative) is a jump
    target_jump: float = 0.02       # a target change this large is a jump


DEFAULT_GAINS = Gains()


@dataclass(frozen=True)
class Observation:
    """What one step of the loop sees.

    target     effective target share 0..1 this step
    dt         seconds since the previous step
    launches   launches through the hook during those dt seconds
    measured   the job's share over the latest measurement window, or None
               when no new measurement arrived this step
    busy_s     GPU-busy seconds of the job over that window (None: no window)
    window_launches  launches of the job over that same window (None: unknown)
    window_s   length of that window in seconds (None: dt)
    measured_low  a lower bound of the share when the window only bounds it
               (NVML averaged several sample periods in one read): measured
               is then an upper bound, and the PI acts only where both agree
    owed_cap   the most the making up of the job's start may add this step
               (None: what it is owed): the GPU's room no share claims, its
               part of it (start_room)
    """

    target: float
    dt: float
    launches: float
    measured: float | None = None
    busy_s: float | None = None
    window_launches: float | None = None
    window_s: float | None = None
    measured_low: float | None = None
    owed_cap: float | None = None


@dataclass(frozen=True)
class Command:
    """What the hook's bucket gets: launches per second and bucket size in
    launches (the caller scales both to tokens). throttle False: no gate."""

    throttle: bool
    rate: float = 0.0
    bucket: float = 0.0


@dataclass
class ShareLoop:
    """The state of one job's loop on one GPU."""

    busy_sum: float = 0.0           # EWMA of GPU-busy seconds
    launch_sum: float = 0.0         # EWMA of launches over the same windows
    integral: float = 0.0           # share units
    rate: float | None = None       # launches/s granted last step; None: ungated
    target: float | None = None     # target of the last step
    settle: int = 0                 # measurements the PI still ignores
    commanded: float | None = None  # share asked for last step (target + PI)
    backlogged: bool = False        # last step: the bucket was what limited the job
    used: float | None = None       # last span: launched / allowed
    span_launches: float = 0.0      # launches since `used` was last taken...
    span_allowed: float = 0.0       # ...and what the bucket allowed meanwhile
    life_s: float | None = None     # seconds since the job's first launch (None: none yet)...
    life_launches: float = 0.0      # ...and its launches since
    catching_up: bool = True        # its start may still be made up (catch_up_s)
    catch_until: float = 0.0        # ...or until this far into its life (a hold for a
                                    # probe, made up after it: catch_up_after)...
    owe_from: tuple[float, float] | None = None  # ...counted from this (life_s,
                                    # life_launches): from the hold, not the start
    owing: bool = False             # last step it was making up its start
    window_s: float | None = None   # the shortest measurement window seen

    @property
    def cost(self) -> float | None:
        """Estimated GPU seconds per launch, None before the first estimate."""
        if self.launch_sum <= 0.0 or self.busy_sum <= 0.0:
            return None
        return self.busy_sum / self.launch_sum

    def observe_cost(self, busy_s: float, launches: float, window_s: float,
                     gains: Gains) -> None:
        """Fold one window's (busy seconds, launches) pair into the estimate."""
        if busy_s < 0.0 or launches < 0.0 or (busy_s == 0.0 and launches == 0.0):
            return
        decay = 0.5 ** (max(window_s, 0.0) / gains.cost_halflife_s)
        if self.launch_sum > 0.0:
            # keep at least cost_min_launches launches' worth of history
            keep = (gains.cost_min_launches - launches) / self.launch_sum
            decay = min(1.0, max(decay, keep))
        self.busy_sum = self.busy_sum * decay + busy_s
        self.launch_sum = self.launch_sum * decay + launches


def step(loop: ShareLoop, obs: Observation, gains: Gains | None = None) -> Command:
    """One control step: update the loop's state from obs, return the gate."""
    gains = gains or DEFAULT_GAINS
    target = min(max(obs.target, 0.0), 1.0)
    # Until the first cost estimate the rate rests on a guess: what it gives
    # says nothing the PI should remember.
    guessed = loop.cost is None
    if obs.busy_s is not None and obs.window_launches is not None:
        window_s = obs.window_s if obs.window_s is not None else obs.dt
        busy_s = obs.busy_s
        if busy_s <= 0.0 and obs.window_launches >= 1.0:
            # Launches too short for NVML to report (it counts whole percents
            # of a period): the cost is below that resolution. Take half of it,
            # so the rate grows until the job shows up in the samples.
            busy_s = 0.5 * gains.resolution * window_s
        if busy_s > 0.0 or obs.window_launches >= 1.0:
            # (not a window that holds less than one launch and nothing
            # seen: the edge of the job's start, which says nothing)
            loop.observe_cost(busy_s, obs.window_launches, window_s, gains)

    # Did the bucket limit the job, or did it launch less than allowed? Over
    # a span of steps that allowed a few launches: one step of a job that
    # launches ten times a second says nothing.
    prev_rate = loop.rate
    used: float | None = None           # launched / allowed, this span
    backlogged = loop.backlogged
    if prev_rate is not None and prev_rate > 0 and obs.dt > 0:
        loop.span_launches += obs.launches
        loop.span_allowed += prev_rate * obs.dt
        if loop.span_allowed >= gains.min_span_launches:
            used = loop.span_launches / loop.span_allowed
            backlogged = used >= gains.backlog_ratio and loop.span_launches > 0
            loop.span_launches = loop.span_allowed = 0.0
    else:
        loop.span_launches = loop.span_allowed = 0.0
        backlogged = False
    track_life(loop, obs, prev_rate, used, gains)
    # Over the measurement window (steadier than one step): did the job use
    # most of what it was allowed? Only then may the PI push its rate up.
    window_used = used
    if (prev_rate is not None and prev_rate > 0 and obs.window_launches is not None
            and obs.window_s):
        window_used = obs.window_launches / (prev_rate * obs.window_s)
    may_push_up = window_used is not None and window_used >= gains.pi_usage_ratio

    # The measurement window lags the step: after a jump of the target, or
    # when an idle job starts launching, the next windows still show the
    # past. The PI ignores them.
    if loop.target is not None and abs(target - loop.target) >= gains.target_jump:
        loop.settle = gains.settle_steps
    if (used is not None and used >= gains.pi_usage_ratio and loop.used is not None
            and loop.used < gains.idle_ratio):
        loop.settle = gains.settle_steps
    if used is not None or prev_rate is None:
        loop.used = used
    loop.backlogged = backlogged
    loop.target = target
    if target >= FULL:
        loop.rate = None
        loop.integral = 0.0
        loop.settle = 0
        loop.commanded = None
        return Command(throttle=False)

    error = 0.0
    # A measurement is good to 1/2 % (whole percents): for small targets that
    # is a large part of the target, so the PI moves less on each one.
    fine = min(1.0, target / gains.coarse_share)
    # What a cautious start left the job short of, made up now; meanwhile
    # the windows show the making up, nothing for the PI to remember.
    owed = start_owed(loop, target, gains)
    if obs.owed_cap is not None:
        owed = min(owed, max(0.0, obs.owed_cap))
    if loop.owing and owed <= 0.0:
        loop.settle = max(loop.settle, gains.settle_steps)   # the windows still show it
    loop.owing = owed > 0.0
    if obs.measured is not None:
        raw = _certain_error(target, obs.measured, obs.measured_low)
        if loop.settle > 0:
            # The window still shows the rate before the last jump.
            loop.settle -= 1
        elif guessed or owed > 0.0:
            pass
        elif raw < 0.0 or may_push_up:
            # Anti-windup: a job below its target that did not use what it
            # was allowed (idle, busy on the host, or held back by the
            # device) says nothing about its rate: neither term pushes it up.
            # Pushing down is always allowed.
            error = raw
        loop.integral += gains.ki * fine * error
        limit = gains.integral_limit * max(target, 0.05)
        loop.integral = min(max(loop.integral, -min(limit, 0.8 * target)), limit)

    commanded = target + loop.integral + gains.kp * fine * error + owed
    commanded = min(max(commanded, 0.2 * target), 1.0)
    if loop.cost is not None:
        rate = max(commanded / loop.cost, gains.min_rate)
    else:
        rate = start_rate(commanded, gains)
    # A jump of the rate (new target, first cost estimate, soft capacity
    # lent or taken back): the next windows still show the old rate.
    if prev_rate is None or abs(rate - prev_rate) > gains.rate_jump * prev_rate:
        loop.settle = gains.settle_steps
    loop.rate = rate
    loop.commanded = commanded
    return Command(throttle=True, rate=rate, bucket=max(1.0, rate * gains.bucket_s))


# ---- a job's start (docs/compute.md, start-up) ----------------------------------

def start_rate(target: float, gains: Gains) -> float:
    """The cautious rate a job starts at, before any cost estimate."""
    return max(target / gains.initial_cost_s, gains.min_rate, gains.start_min_rate)


def track_life(loop: ShareLoop, obs: Observation, prev_rate: float | None,
               used: float | None, gains: Gains) -> None:
    """Count the seconds and launches since the job's first launch, and end
    its catching up once it does not use what it is allowed (it was not
    short of its share for want of a rate then, and must not burst later)."""
    if loop.life_s is None:
        if obs.launches <= 0.0:
            return
        # the first launches came within this step: at the gate's rate, the
        # time they took (a burst of the bucket aside), never more than dt
        rate = prev_rate or start_rate(obs.target, gains)   # the region's first gate
        active = min(obs.dt, max(0.0, (obs.launches - 1.0) / rate))
        loop.life_s = active
        loop.life_launches = obs.launches
        return
    loop.life_s += obs.dt
    loop.life_launches += obs.launches
    if used is not None and used < gains.pi_usage_ratio:
        loop.catching_up = False
    if obs.window_s:   # the shortest window seen: NVML's period (a late read spans more)
        loop.window_s = min(loop.window_s or obs.window_s, obs.window_s)
    if loop.life_s > catch_up_by(loop, gains):
        loop.catching_up = False


def start_owed(loop: ShareLoop, target: float, gains: Gains) -> float:
    """The share to add this step so that, by catch_up_s after its first
    launch, a new job has what its cautious start (initial_cost_s) left it
    short of: the GPU time its share gives over its life so far, less what
    its launches took at the estimated cost, spread over what is left of
    catch_up_s (at least catch_up_min_s). Recomputed every step from the
    totals, so a better cost estimate corrects it, and never negative: a
    start above the share is not paid back (the windows after it would show
    the job below its share)."""
    if not loop.catching_up or loop.life_s is None or loop.cost is None:
        return 0.0
    life_s, launches = loop.life_s, loop.life_launches
    if loop.owe_from is not None:
        life_s -= loop.owe_from[0]
        launches -= loop.owe_from[1]
    owed_s = target * life_s - loop.cost * launches
    left = catch_up_by(loop, gains) - loop.life_s
    return max(0.0, owed_s / max(gains.catch_up_min_s, left))


def start_room(claims: Iterable[Claim], targets: dict[Hashable, float], capacity: float,
               making_up: Iterable[Hashable]) -> dict[Hashable, float]:
    """What each job that may still be making up its start (making_up) may
    add for it this step: the GPU's room that no active job's share claims
    (capacity less each one's share, or its target if lower: what a soft job
    borrows is not claimed), in proportion to their shares. Several jobs that
    start together on a full GPU would otherwise make up at each other's
    expense, the one with the longest kernels winning the race for the
    device (docs/compute.md, start-up)."""
    claims = list(claims)
    claimed = sum(min(c.share, targets.get(c.key, c.share)) for c in claims if c.active)
    room = max(0.0, capacity - claimed)
    owing = set(making_up)
    total = sum(c.share for c in claims if c.key in owing)
    return {c.key: room * c.share / total for c in claims if c.key in owing and total > 0}


def catch_up_by(loop: ShareLoop, gains: Gains) -> float:
    """How long after its first launch a job's start is made up by:
    catch_up_s, or catch_up_periods of NVML's sample period if that is
    longer (the first cost can't come before the first period closes)."""
    return max(gains.catch_up_s, gains.catch_up_periods * (loop.window_s or 0.0),
               loop.catch_until)


def hold_begins(loop: ShareLoop) -> None:
    """The job is about to be held back (a probe holds it for a sample
    period, docs/compute.md): what it is owed after is counted from now."""
    if loop.life_s is not None:
        loop.owe_from = (loop.life_s, loop.life_launches)


def catch_up_after(loop: ShareLoop, seconds: float) -> None:
    """The hold is over: what it left the job short of its share since
    hold_begins is made up as a start is, within the next ``seconds``, with
    GPU time no share claims (start_room) only. (Not what its whole life
    left it short of: a job idle for a while was not owed that time.)"""
    if loop.life_s is None or loop.owe_from is None:
        return
    loop.catching_up = True
    loop.catch_until = loop.life_s + seconds


def _certain_error(target: float, measured: float, low: float | None) -> float:
    """The share error the PI may act on. With a lower bound below the
    measurement (a window that only bounds the share) that is the part of the
    error both bounds agree on: under target by at least target - measured,
    over it by at least low - target, or nothing."""
    if low is None or low >= measured:
        return target - measured
    if measured < target:
        return target - measured
    if low > target:
        return target - low
    return 0.0


@dataclass(frozen=True)
class Claim:
    """One job on one GPU, as the policy sees it.

    share      its own share 0..1
    policy     "hard" or "soft"
    active     it launched kernels recently (an idle job lends its share)
    wants_more its bucket limited it, or it runs ungated: it would use more
    """

    key: Hashable
    share: float
    policy: str = HARD
    active: bool = True
    wants_more: bool = True
    promised: bool = True   # its share is a promise (asked for, normal or high class)


def effective_targets(claims: Iterable[Claim], capacity: float = 1.0) -> dict[Hashable, float]:
    """Each job's target share on one GPU under the hard/soft policies.

    hard: its share. soft: its share plus, if it wants more, its part (in
    proportion to shares) of what the idle jobs leave unclaimed. A soft job
    alone on its GPU gets the whole GPU.

    capacity is the part of the GPU's time that kernels can actually fill
    (switching between processes costs some, see `Capacity`). When the active
    jobs' shares add up to more, every share is scaled down alike, so the loss
    is spread in proportion instead of falling on whichever job loses the
    race for the device.
    """
    claims = list(claims)
    shares = {c.key: min(max(c.share, 0.0), 1.0) for c in claims}
    if len(claims) == 1 and claims[0].policy == SOFT:
        return {claims[0].key: 1.0}
    capacity = min(max(capacity, 0.0), 1.0)
    claimed = sum(shares[c.key] for c in claims if c.active)
    scale = min(1.0, capacity / claimed) if claimed > 0 else 1.0
    out = {k: v * scale for k, v in shares.items()}
    free = max(0.0, capacity - claimed)
    borrowers = [c for c in claims if c.policy == SOFT and c.active and c.wants_more]
    weight = sum(shares[c.key] for c in borrowers)
    if free <= 0.0 or weight <= 0.0:
        return out
    for c in borrowers:
        out[c.key] = min(1.0, out[c.key] + free * shares[c.key] / weight)
    return out


def class_targets(claims: Iterable[Claim], capacity: float = 1.0) -> dict[Hashable, float]:
    """Each job's target share on one GPU when some shares are promises and
    some are not.

    Promised shares (the jobs that asked for one, of class normal or high)
    are divided by `effective_targets`. A job with no promise (run without
    --core, or of class low, whose share is a cap only) gets what the active
    promises leave, split evenly among the active such jobs and never above
    its own share (a soft one may take all of its part): while no promised
    job is active it keeps its share, as before (a share of 100 % is no gate
    at all). With no job unpromised this is `effective_targets`.
    """
    claims = list(claims)
    promised = [c for c in claims if c.promised]
    free_jobs = [c for c in claims if not c.promised]
    if not free_jobs:
        return effective_targets(promised, capacity)
    capacity = min(max(capacity, 0.0), 1.0)
    out: dict[Hashable, float] = {}
    claimed = sum(min(max(c.share, 0.0), 1.0) for c in promised if c.active)
    if promised:
        # what the promises get: as if the unpromised jobs were idle lenders
        # when none of them is active, else with nothing left to borrow
        active_free = [c for c in free_jobs if c.active]
        # (the others, as idle jobs of no share: a soft job is not "alone")
        others = [Claim(c.key, 0.0, HARD, active=False, wants_more=False) for c in free_jobs]
        got = effective_targets(
            promised + others, capacity if not active_free else min(capacity, max(claimed, 0.0)))
        out.update({c.key: got[c.key] for c in promised})
    if claimed <= 0.0:
        for c in free_jobs:
            out[c.key] = min(max(c.share, 0.0), 1.0)
        return out
    left = max(0.0, capacity - claimed)
    takers = [c for c in free_jobs if c.active] or free_jobs
    part = left / len(takers)
    for c in free_jobs:
        own = min(max(c.share, 0.0), 1.0)
        out[c.key] = part if c.policy == SOFT else min(own, part)
    return out


@dataclass
class Capacity:
    """How much of one GPU's time kernels can fill, learnt from NVML.

    Each switch between two processes' kernels leaves the device idle a
    little (on a real GPU a context switch; on the simulator a worker's
    wake-up), so a fully subscribed GPU delivers less than 100 %. While the
    GPU is busy and some job is held back by the device (below its target
    without using its allowance), the GPU's total utilization is what it can
    deliver. When the GPU has room that nobody wants, the estimate goes back
    to 1 quickly; when it is busy and nobody is held back, slowly; a window
    with room and a job held back (busy on its host, or its host was late)
    changes nothing.

    The weights are those of a window of ``window_ref_s`` (NVML's shortest
    sample period); a longer window weighs as that many short ones, so the
    estimate follows the GPU as fast in seconds whatever NVML's period.
    """

    value: float = 1.0
    floor: float = 0.9                  # never assume less than this
    alpha_down: float = 0.3             # weight of a window that shows a full GPU,
                                        # or one with room that nobody wants
    alpha_up: float = 0.03              # weight of a busy window where nobody is held
                                        # back: recover slowly, or the held-back job
                                        # loses it all again
    saturated_util: float = 0.9         # total utilization above which a GPU may be full
    window_ref_s: float = 1 / 6         # the window the weights are for

    def observe(self, util: float, starved: bool, window_s: float | None = None) -> float:
        """Fold one measurement window of window_s seconds (default: the
        reference); util = the GPU's total busy share."""
        if starved:
            if util < self.saturated_util:
                # Room on the GPU and a job below target: busy on its host,
                # or its host was late. Neither says what the GPU can fill.
                return self.value
            obs, alpha = min(1.0, util), self.alpha_down
        elif util < self.saturated_util:
            obs, alpha = 1.0, self.alpha_down       # room, and nobody wants it
        else:
            obs, alpha = 1.0, self.alpha_up
        if window_s is not None and window_s > 0:
            alpha = 1.0 - (1.0 - alpha) ** (window_s / self.window_ref_s)
        self.value = min(1.0, max(self.floor, self.value + alpha * (obs - self.value)))
        return self.value


@dataclass
class LaunchHistory:
    """Cumulative launch counts at known wall times, to count the launches
    that fall inside a measurement window whose edges are not tick times."""

    points: list[tuple[float, float]] = field(default_factory=list)
    keep_s: float = 5.0

    def add(self, t: float, cumulative: float) -> None:
        if self.points and t <= self.points[-1][0]:
            return
        self.points.append((t, cumulative))
        cutoff = t - self.keep_s
        while len(self.points) > 2 and self.points[1][0] < cutoff:
            self.points.pop(0)

    def at(self, t: float) -> float | None:
        """Cumulative launches at time t (linear between points), None when t
        lies outside the history (beyond a small tolerance at the new end)."""
        pts = self.points
        if not pts or t < pts[0][0]:
            return None
        if t >= pts[-1][0]:
            return pts[-1][1] if t - pts[-1][0] <= 0.25 else None
        lo, hi = 0, len(pts) - 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if pts[mid][0] <= t:
                lo = mid
            else:
                hi = mid
        (t0, c0), (t1, c1) = pts[lo], pts[hi]
        return c0 + (c1 - c0) * (t - t0) / (t1 - t0)

    def between(self, t0: float, t1: float) -> float | None:
        a, b = self.at(t0), self.at(t1)
        if a is None or b is None:
            return None
        return max(0.0, b - a)


def to_tokens(launches: float, scale: int) -> int:
    """Launches (or launches/s) to the hook's integer tokens, at least 1."""
    if not math.isfinite(launches):
        return 2**62
    return max(1, round(launches * scale))
