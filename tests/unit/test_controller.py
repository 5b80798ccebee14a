"""The compute-share controller against a tiny plant in pure Python: no NVML,
no processes, no clocks. The plant: a saturating job granted `rate` launches
per second, each taking `c` GPU-seconds, gets share min(1, rate * c) /
contention; the measurement arrives one step late, as NVML's does."""

from __future__ import annotations

import math

import pytest

from vgpuctl.core import controller as ctl

DT = 0.1


class Plant:
    """One saturating (or idle, or host-bound) job on one GPU."""

    def __init__(self, cost_s: float, contention: float = 1.0) -> None:
        self.cost_s = cost_s
        self.contention = contention
        self.demand = math.inf          # launches/s the job would make unthrottled

    def run(self, cmd: ctl.Command) -> tuple[float, float]:
        """Run one step under the gate; return (true share, launches)."""
        rate = cmd.rate if cmd.throttle else math.inf
        launches_per_s = min(rate, self.demand, 1.0 / self.cost_s)
        share = min(1.0, launches_per_s * self.cost_s) / self.contention
        return share, launches_per_s * DT


def drive(plant: Plant, loop: ctl.ShareLoop, targets: list[float],
          gains: ctl.Gains | None = None) -> list[float]:
    """Run the closed loop; targets is a list of per-step target shares.
    Returns the true share of each step."""
    shares = []
    last: tuple[float, float] | None = None
    if loop.rate is not None:
        cmd = ctl.Command(throttle=True, rate=loop.rate, bucket=1)
    else:
        cmd = ctl.Command(throttle=True, rate=1.0 / plant.cost_s * targets[0] * 0.1, bucket=1)
    for target in targets:
        share, launches = plant.run(cmd)
        shares.append(share)
        if last is None:
            obs = ctl.Observation(target=target, dt=DT, launches=launches)
        else:
            # the measurement window lags one step: it covers the previous step
            m, wl = last
            obs = ctl.Observation(target=target, dt=DT, launches=launches, measured=m,
                                  busy_s=m * DT, window_launches=wl, window_s=DT)
        last = (share, launches)
        cmd = ctl.step(loop, obs, gains)
    return shares


@pytest.mark.parametrize("cost_s", [10e-6, 50e-6, 500e-6, 5e-3, 10e-3])
@pytest.mark.parametrize("target", [0.2, 0.3, 0.6])
def test_converges_for_kernels_from_10us_to_10ms(cost_s: float, target: float) -> None:
    loop = ctl.ShareLoop()
    shares = drive(Plant(cost_s), loop, [target] * 40)
    # within 10 steps (1 s at the default tick) and stays there
    assert all(abs(s - target) < 0.01 for s in shares[10:]), shares
    assert loop.cost == pytest.approx(cost_s, rel=0.02)


@pytest.mark.parametrize("contention", [1.0, 1.25, 2.0])
def test_converges_under_contention(contention: float) -> None:
    # other jobs' kernels make each launch worth less device share (launches
    # queue up behind theirs)
    shares = drive(Plant(1e-3, contention), ctl.ShareLoop(), [0.3] * 40)
    assert all(abs(s - 0.3) < 0.01 for s in shares[15:]), shares


def test_share_bias_in_measurement_is_corrected_by_integral() -> None:
    # the measurement says 90 % of the truth (e.g. rounding down): the cost
    # estimate is off by the same factor, the loop holds the *measured* share
    plant = Plant(1e-3)
    loop = ctl.ShareLoop()
    cmd = ctl.Command(True, 10.0, 1.0)
    measured = []
    for _ in range(60):
        share, launches = plant.run(cmd)
        m = share * 0.9
        cmd = ctl.step(loop, ctl.Observation(0.3, DT, launches, m, m * DT, launches, DT))
        measured.append(m)
    assert abs(measured[-1] - 0.3) < 0.01


def test_no_windup_after_long_idle() -> None:
    plant = Plant(1e-3)
    loop = ctl.ShareLoop()
    drive(plant, loop, [0.3] * 30)
    rate_before = loop.rate
    # the job goes idle for a long time: it launches nothing, measured 0;
    # the rate it is granted does not grow meanwhile
    cmd = ctl.Command(True, rate_before or 1.0, 1.0)
    for _ in range(500):
        cmd = ctl.step(loop, ctl.Observation(0.3, DT, 0.0, 0.0, 0.0, 0.0, DT))
    assert cmd.rate == pytest.approx(rate_before, rel=0.05)
    # it comes back: never above its target by more than the tolerance
    shares = drive(plant, loop, [0.3] * 20)
    assert max(shares[1:]) <= 0.3 + 0.01, shares


def test_no_windup_when_host_bound() -> None:
    # the job can only launch half of what its share needs (busy on the host)
    plant = Plant(1e-3)
    plant.demand = 150.0      # 0.15 share at most
    loop = ctl.ShareLoop()
    shares = drive(plant, loop, [0.3] * 200)
    assert max(shares) <= 0.15 + 1e-9
    # the host work ends; the job becomes saturating: no burst above target
    plant.demand = math.inf
    shares = drive(plant, loop, [0.3] * 20)
    assert max(shares[1:]) <= 0.3 + 0.01, shares


def test_no_windup_before_the_first_cost_estimate() -> None:
    # 20 ms kernels, four times the 5 ms a start is cautious for: the job
    # runs far above its target until a window with its launches gives a
    # cost (with a 1 s NVML period, two seconds). Those measurements say
    # nothing of the PI's error.
    plant = Plant(20e-3)
    loop = ctl.ShareLoop()
    cmd = ctl.step(loop, ctl.Observation(0.3, DT, 0.0))
    for _ in range(20):
        share, launches = plant.run(cmd)
        cmd = ctl.step(loop, ctl.Observation(0.3, DT, launches, measured=share))
    assert share == 1.0 and loop.cost is None
    assert loop.integral == 0.0
    shares = drive(plant, loop, [0.3] * 20)
    assert all(abs(x - 0.3) < 0.01 for x in shares[3:]), shares


def _settled_loop() -> ctl.ShareLoop:
    loop = ctl.ShareLoop()
    drive(Plant(1e-3), loop, [0.3] * 30)
    assert loop.settle == 0
    return loop


def test_a_window_that_only_bounds_the_share_moves_the_pi_by_what_is_certain() -> None:
    """NVML averaged two periods in one read: the job's share was between
    measured_low and measured. The PI acts only on the part of the error both
    bounds agree on."""
    obs = {"target": 0.3, "dt": DT, "launches": 30.0, "window_launches": 30.0, "window_s": DT}
    # 0.2 .. 0.4 straddles the target: nothing is certain
    loop = _settled_loop()
    before = loop.integral
    ctl.step(loop, ctl.Observation(**obs, measured=0.4, measured_low=0.2))
    assert loop.integral == before
    # 0.35 .. 0.5: over by at least 0.05, not by 0.2
    ctl.step(loop, ctl.Observation(**obs, measured=0.5, measured_low=0.35))
    assert loop.integral == pytest.approx(before - ctl.Gains().ki * 0.05)
    # 0.1 .. 0.25: under by at least 0.05
    loop = _settled_loop()
    before = loop.integral
    ctl.step(loop, ctl.Observation(**obs, measured=0.25, measured_low=0.1))
    assert loop.integral == pytest.approx(before + ctl.Gains().ki * 0.05)


def test_a_job_of_a_few_launches_a_step_is_not_taken_for_idle() -> None:
    # 1 % of 1 ms kernels: ten launches a second, so a 100 ms step holds none
    # or two. That is no idle job starting again each time (which would keep
    # the PI waiting for ever), nor one the bucket holds back.
    loop = ctl.ShareLoop()
    for i in range(60):
        launches = 2.0 if i % 2 else 0.0
        ctl.step(loop, ctl.Observation(0.01, DT, launches, measured=0.01, busy_s=0.01 * DT,
                                       window_launches=1.0, window_s=DT))
        if i > 10:
            assert loop.settle == 0, i
    assert loop.used == pytest.approx(1.0, abs=0.35)
    assert loop.rate == pytest.approx(10.0, rel=0.05)


def test_small_targets_move_the_pi_less_per_measurement() -> None:
    # NVML reads a 1 % job in whole percents: one reading of 0 or 2 is an
    # error of the whole target, and must not swing its rate by that much
    big, small = _settled_loop(), ctl.ShareLoop()
    for _ in range(30):
        ctl.step(small, ctl.Observation(0.01, DT, 1.0, 0.01, 0.01 * DT, 1.0, DT))
    b0, s0 = big.integral, small.integral
    ctl.step(big, ctl.Observation(0.3, DT, 30.0, 0.29, 0.029, 30.0, DT))
    ctl.step(small, ctl.Observation(0.01, DT, 1.0, 0.0, 0.0, 1.0, DT))
    assert big.integral - b0 == pytest.approx(ctl.Gains().ki * 0.01)
    assert small.integral - s0 == pytest.approx(ctl.Gains().ki * 0.01 * 0.1)


def test_live_target_change_up_and_down() -> None:
    plant = Plant(500e-6)
    loop = ctl.ShareLoop()
    shares = drive(plant, loop, [0.3] * 20 + [0.6] * 20 + [0.2] * 20)
    # 30 -> 60: within 2 points of 60 in under 1 s (10 steps), no overshoot
    assert all(abs(s - 0.6) < 0.02 for s in shares[23:40]), shares[20:40]
    assert max(shares[20:40]) <= 0.62
    # 60 -> 20: down on the next step
    assert all(abs(s - 0.2) < 0.02 for s in shares[42:]), shares[40:]


def test_full_target_is_not_throttled() -> None:
    loop = ctl.ShareLoop()
    cmd = ctl.step(loop, ctl.Observation(target=1.0, dt=DT, launches=100))
    assert cmd.throttle is False
    # and back under a gate when the target drops
    cmd = ctl.step(loop, ctl.Observation(target=0.5, dt=DT, launches=100, measured=1.0,
                                         busy_s=0.1, window_launches=100, window_s=DT))
    assert cmd.throttle is True
    assert cmd.rate == pytest.approx(0.5 / 1e-3, rel=0.2)


def test_bucket_is_small_but_at_least_one_launch() -> None:
    gains = ctl.Gains()
    for cost_s in (10e-6, 10e-3):
        loop = ctl.ShareLoop()
        drive(Plant(cost_s), loop, [0.3] * 20)
        cmd = ctl.step(loop, ctl.Observation(0.3, DT, 0.3 * DT / cost_s))
        assert cmd.bucket >= 1.0
        # at most max(1 launch, bucket_s worth of launches)
        assert cmd.bucket <= max(1.0, cmd.rate * gains.bucket_s) + 1e-9
        # the bucket alone cannot overshoot a window by more than bucket_s of share
        assert cmd.bucket * cost_s <= max(cost_s, 0.3 * gains.bucket_s * 1.1)


def test_gains_normalised_per_device() -> None:
    # the same share error moves the command by the same share amount
    # whatever the kernel size (no SM-count or rate-scaled gain)
    moves = []
    for cost_s in (10e-6, 10e-3):
        loop = ctl.ShareLoop()
        drive(Plant(cost_s), loop, [0.4] * 20)
        before = loop.rate * loop.cost
        ctl.step(loop, ctl.Observation(0.4, DT, loop.rate * DT, 0.3, 0.3 * DT,
                                       0.3 * DT / cost_s, DT))
        moves.append(loop.rate * loop.cost - before)
    assert moves[0] > 0
    assert moves[0] == pytest.approx(moves[1], rel=0.1)


# ---- policies ---------------------------------------------------------------

def C(key: str, share: float, policy: str = ctl.HARD, active: bool = True,
      wants_more: bool = True) -> ctl.Claim:
    return ctl.Claim(key, share, policy, active, wants_more)


def test_hard_never_above_share_even_alone() -> None:
    assert ctl.effective_targets([C("a", 0.3)]) == {"a": 0.3}
    assert ctl.effective_targets([C("a", 0.3), C("b", 0.2, active=False)]) == {"a": 0.3, "b": 0.2}


def test_soft_alone_gets_the_whole_gpu() -> None:
    assert ctl.effective_targets([C("a", 0.3, ctl.SOFT)]) == {"a": 1.0}
    # even while idle: its first launches must not be gated
    assert ctl.effective_targets([C("a", 0.3, ctl.SOFT, active=False)]) == {"a": 1.0}


def test_soft_jobs_split_idle_capacity_by_share() -> None:
    t = ctl.effective_targets([C("a", 0.3, ctl.SOFT), C("b", 0.3, ctl.SOFT)])
    assert t["a"] == pytest.approx(0.5) and t["b"] == pytest.approx(0.5)
    t = ctl.effective_targets([C("a", 0.2, ctl.SOFT), C("b", 0.4, ctl.SOFT)])
    assert t["a"] == pytest.approx(0.2 + 0.4 / 3) and t["b"] == pytest.approx(0.4 + 0.8 / 3)


def test_soft_borrows_from_idle_owner_and_gives_back() -> None:
    lend = ctl.effective_targets([C("soft", 0.3, ctl.SOFT), C("owner", 0.6, active=False)])
    assert lend["soft"] == pytest.approx(1.0)
    back = ctl.effective_targets([C("soft", 0.3, ctl.SOFT), C("owner", 0.6)])
    assert back["soft"] == pytest.approx(0.4)   # the 10 % nobody claims
    assert back["owner"] == pytest.approx(0.6)


def test_soft_job_that_does_not_want_more_does_not_take_it() -> None:
    t = ctl.effective_targets([C("a", 0.3, ctl.SOFT, wants_more=False),
                               C("b", 0.3, ctl.SOFT)])
    assert t == {"a": pytest.approx(0.3), "b": pytest.approx(0.7)}


def test_full_gpu_scales_every_share_alike() -> None:
    # the GPU can fill 96 % of its time: three hard jobs adding up to 100 %
    # each lose in proportion, not whoever loses the race for the device
    t = ctl.effective_targets([C("a", 0.2), C("b", 0.3), C("c", 0.5)], capacity=0.96)
    assert t == {"a": pytest.approx(0.192), "b": pytest.approx(0.288),
                 "c": pytest.approx(0.48)}
    # not subscribed to the full: nothing changes
    t = ctl.effective_targets([C("a", 0.3), C("b", 0.6)], capacity=0.96)
    assert t == {"a": pytest.approx(0.3), "b": pytest.approx(0.6)}
    # soft jobs borrow what is left of the capacity, not of 100 %
    t = ctl.effective_targets([C("a", 0.3, ctl.SOFT), C("b", 0.3, ctl.SOFT)], capacity=0.96)
    assert t["a"] + t["b"] == pytest.approx(0.96)


def test_capacity_is_learnt_only_when_a_job_is_held_back() -> None:
    cap = ctl.Capacity()
    for _ in range(30):
        cap.observe(0.97, starved=False)     # busy, but nobody is held back
    assert cap.value == 1.0
    for _ in range(30):
        cap.observe(0.97, starved=True)
    assert cap.value == pytest.approx(0.97, abs=0.005)
    # the held-back job reaches its scaled target: no quick way back up
    cap.observe(0.97, starved=False)
    assert cap.value < 0.975
    # a window with room while a job is below target (its host was late,
    # or it is busy on the host): says nothing
    held = cap.value
    cap.observe(0.5, starved=True)
    assert cap.value == held
    for _ in range(30):
        cap.observe(0.5, starved=False)      # room that nobody wants
    assert cap.value == pytest.approx(1.0, abs=0.005)


def test_capacity_follows_the_gpu_as_fast_whatever_the_window() -> None:
    # one window of 1 s weighs as six of 1/6 s: with NVML's longest period
    # the estimate is not six times slower
    short, long_ = ctl.Capacity(), ctl.Capacity()
    for _ in range(6):
        short.observe(0.95, starved=True, window_s=1 / 6)
    long_.observe(0.95, starved=True, window_s=1.0)
    assert long_.value == pytest.approx(short.value)
    assert long_.value < 0.97


def test_host_bound_job_does_not_shrink_the_others() -> None:
    # 50 + 50 hard, one busy on its host at 20 %: the GPU is not full
    cap = ctl.Capacity()
    for _ in range(100):
        cap.observe(0.7, starved=True)
    assert cap.value == 1.0


# ---- helpers ----------------------------------------------------------------

def test_launch_history_interpolates_inside_and_refuses_outside() -> None:
    h = ctl.LaunchHistory()
    h.add(10.0, 100)
    h.add(10.1, 200)
    h.add(10.2, 200)
    assert h.between(10.05, 10.15) == pytest.approx(50)
    assert h.between(10.0, 10.2) == pytest.approx(100)
    assert h.at(9.0) is None
    assert h.at(11.0) is None           # far beyond the newest point


def test_to_tokens() -> None:
    assert ctl.to_tokens(0.0001, 1000) == 1
    assert ctl.to_tokens(2.5, 1000) == 2500
    assert ctl.to_tokens(math.inf, 1000) > 10**15


# -- promises and shares that are not (class_targets) --------------------------------

def test_a_job_with_no_promise_gets_what_the_active_promises_leave():
    claims = [ctl.Claim("a", 0.2), ctl.Claim("b", 1.0, promised=False)]
    t = ctl.class_targets(claims)
    assert t["a"] == pytest.approx(0.2) and t["b"] == pytest.approx(0.8)
    # the promised job idle: the other keeps its own share (1: no gate)
    t = ctl.class_targets([ctl.Claim("a", 0.2, active=False),
                           ctl.Claim("b", 1.0, promised=False)])
    assert t["b"] == 1.0


def test_jobs_with_no_promise_split_the_rest_evenly_within_their_shares():
    t = ctl.class_targets([ctl.Claim("a", 0.4), ctl.Claim("b", 1.0, promised=False),
                           ctl.Claim("c", 0.1, promised=False),
                           ctl.Claim("d", 0.1, ctl.SOFT, promised=False)])
    assert t["a"] == pytest.approx(0.4)
    assert t["b"] == pytest.approx(0.2) and t["d"] == pytest.approx(0.2)
    assert t["c"] == pytest.approx(0.1)          # hard: never above its own share


def test_promised_soft_jobs_borrow_nothing_from_active_jobs_with_no_promise():
    t = ctl.class_targets([ctl.Claim("a", 0.3, ctl.SOFT), ctl.Claim("b", 1.0, promised=False)])
    assert t["a"] == pytest.approx(0.3) and t["b"] == pytest.approx(0.7)
    t = ctl.class_targets([ctl.Claim("a", 0.3, ctl.SOFT),
                           ctl.Claim("b", 1.0, promised=False, active=False)])
    assert t["a"] == pytest.approx(1.0)          # b idle: a borrows as before


def test_with_every_share_promised_class_targets_is_effective_targets():
    claims = [ctl.Claim("a", 0.2), ctl.Claim("b", 0.3, ctl.SOFT), ctl.Claim("c", 0.5,
                                                                           active=False)]
    assert ctl.class_targets(claims, 0.95) == ctl.effective_targets(claims, 0.95)
