"""The violation rules (vgpuctl.core.violations) and what is done about
them (vgpuctl.core.enforcement), driven with figures: what
counts as a violation, which process is named, when one is new, the
compute budget (a job's, and the sum of a user's jobs'), and what each
on_violation does."""

from __future__ import annotations

import pytest

from vgpuctl.core.compute_debt import BURST_S, BURST_UNGATED_S, allowed
from vgpuctl.core.enforcement import KILL, PROTECT, REPORT, Cooldown, GpuMemory, act
from vgpuctl.core.violations import (
    BYPASS,
    COMPUTE,
    MEMORY,
    NO_JOB,
    USER,
    Checker,
    JobLimits,
    ProcWindow,
)

G = 1 << 30
GPU = "GPU-0"
PERIOD = 1 / 6          # NVML's sample period


def lim(share=0.1, mem=G, job="1", uid=1000, uuid=GPU):
    return JobLimits(job, uuid, mem, share, uid)


def windows(t0: float, seconds: float, busy: dict[int, float], period: float = PERIOD):
    """Windows of one sample period each, from t0 for `seconds`, each pid
    busy the given share of each."""
    out, t = [], t0
    while t < t0 + seconds - 1e-9:
        out.append(ProcWindow(GPU, t, t + period, {p: s * period for p, s in busy.items()}))
        t += period
    return out


def run(c: Checker, limits, busy: dict[int, float], owner, seconds: float, t0: float = 0.0,
        duty=None):
    """Drive the checker a window at a time; the first time a compute
    violation is found (seconds from t0), or None."""
    t = t0
    for w in windows(t0, seconds, busy):
        if duty is not None and not duty(w.start):
            w = ProcWindow(w.uuid, w.start, w.end, {})
        t = w.end
        found, _ = c.check(t, limits, {}, [w], owner)
        if any(v.kind == COMPUTE for v in found):
            return t - t0
    return None


# -- memory ------------------------------------------------------------------------------
def test_a_job_over_its_memory_names_its_largest_process_once():
    c = Checker()
    mem = {GPU: {10: G // 2, 11: G}}
    owner = {(GPU, 10): "1", (GPU, 11): "1"}
    found, new = c.check(0.0, [lim()], mem, [], owner)
    assert [(v.kind, v.pid, v.job_id, v.value) for v in found] == [(MEMORY, 11, "1", 1.5 * G)]
    assert new == found
    found, new = c.check(0.1, [lim()], mem, [], owner)
    assert found and new == []          # still there: not new
    # Back under, then over again: new again.
    c.check(0.2, [lim()], {GPU: {10: G // 2}}, [], owner)
    assert c.check(0.3, [lim()], mem, [], owner)[1]


def test_at_the_limit_is_no_violation_and_others_processes_do_not_count():
    c = Checker()
    mem = {GPU: {10: G, 20: 4 * G}}
    owner = {(GPU, 10): "1", (GPU, 20): "2"}
    found, _ = c.check(0.0, [lim(), lim(job="2", mem=8 * G)], mem, [], owner)
    assert found == []


def test_a_process_in_no_job_is_named():
    found, _ = Checker().check(0.0, [], {GPU: {30: G}}, [], {(GPU, 30): None})
    assert [(v.kind, v.pid, v.job_id) for v in found] == [(NO_JOB, 30, None)]


def test_a_jobs_process_on_a_gpu_it_was_not_given_is_over_a_limit_of_zero():
    other = "GPU-1"
    mem = {other: {10: 64 << 20}}
    found, _ = Checker().check(0.0, [lim()], mem, [], {(other, 10): "1"})
    assert [(v.kind, v.uuid, v.job_id, v.limit) for v in found] == [(MEMORY, other, "1", 0)]


# -- the compute budget ----------------------------------------------------------------------
def test_a_job_within_share_and_margin_is_never_a_violation():
    c = Checker()
    for share in (0.01, 0.1, 0.3, 0.6):
        use = allowed(share) - 0.001
        assert run(c, [lim(share, job=f"j{share}")], {1: use}, {(GPU, 1): f"j{share}"},
                   120.0) is None


def test_a_steady_overrun_is_found_once_its_debt_passes_the_burst():
    c = Checker()
    # 100 % against 10 %: 0.85 GPU-s of debt a second.
    t = run(c, [lim(0.1)], {1: 1.0}, {(GPU, 1): "1"}, 5.0)
    assert t == pytest.approx(BURST_S / (1.0 - allowed(0.1)), abs=PERIOD)


def test_the_budget_is_integrated_a_duty_cycle_cannot_stay_under_it():
    """700 ms at 100 %, 700 ms idle, at --core 10: 50 % on average. A rule
    of "over for 1.5 s in a row" never saw it; the integral does, within
    the first burst."""
    c = Checker()
    t = run(c, [lim(0.1)], {1: 1.0}, {(GPU, 1): "1"}, 20.0,
            duty=lambda s: (s % 1.4) < 0.7)
    assert t is not None and t < 1.4


def test_a_train_of_short_processes_adds_up_in_its_job():
    """Each process busy for 0.4 s, then the next: one job's debt."""
    c = Checker()
    ws = []
    for k in range(10):
        ws += windows(0.4 * k, 0.4, {100 + k: 0.7})
    owner = {(GPU, 100 + k): "1" for k in range(10)}
    found = []
    for w in ws:
        found, _ = c.check(w.end, [lim(0.1)], {}, [w], owner)
        if found:
            break
    assert [v.kind for v in found] == [COMPUTE]


def test_many_small_jobs_of_one_user_are_one_offender():
    """Eight jobs at 1 % each using 10.5 %: each within its own margin (1 %
    plus 5 points), together 84 % against 8 %."""
    c = Checker()
    limits = [lim(0.01, job=str(j)) for j in range(8)]
    owner = {(GPU, 100 + j): str(j) for j in range(8)}
    busy = {100 + j: 0.105 for j in range(8)}
    found, t = [], 0.0
    for w in windows(0.0, 5.0, busy):
        found, _ = c.check(w.end, limits, {}, [w], owner)
        if found:
            t = w.end
            break
    assert sorted(v.job_id for v in found) == [str(j) for j in range(8)]
    assert all(v.kind == COMPUTE and v.scope == USER and v.uid == 1000 for v in found)
    assert t < 1.0
    # Another user's job beside them is never named.
    c2 = Checker()
    limits2 = limits + [lim(0.6, job="other", uid=2000)]
    owner2 = {**owner, (GPU, 200): "other"}
    for w in windows(0.0, 5.0, {**busy, 200: 0.16}):
        found, _ = c2.check(w.end, limits2, {}, [w], owner2)
        assert all(v.job_id != "other" for v in found)


def test_a_lowered_share_stays_in_force_for_the_grace():
    """`set --core 90` -> 10: work already queued runs on for a moment."""
    c = Checker()
    owner = {(GPU, 1): "1"}
    assert run(c, [lim(0.9)], {1: 0.95}, owner, 10.0) is None
    # The share drops; the job runs at 90 % for another second, then 10 %.
    t = 10.0
    for w in windows(t, 1.0, {1: 0.9}):
        assert not c.check(w.end, [lim(0.1)], {}, [w], owner)[0]
    for w in windows(t + 1.0, 20.0, {1: 0.1}):
        assert not c.check(w.end, [lim(0.1)], {}, [w], owner)[0]


def _first_found(c, limits, busy, owner, hooked, seconds=10.0):
    for w in windows(0.0, seconds, busy):
        found, _ = c.check(w.end, limits, {}, [w], owner, hooked)
        if found:
            return w.end, found
    return None, []


def test_busy_time_that_went_through_no_gate_has_a_smaller_burst():
    """The same overrun: from a process that loaded the hook (a gate's
    transient, excused up to BURST_S), or from one that never did."""
    owner = {(GPU, 1): "1"}
    gated, _ = _first_found(Checker(), [lim(0.1)], {1: 0.4}, owner, hooked={1})
    ungated, found = _first_found(Checker(), [lim(0.1)], {1: 0.4}, owner, hooked=set())
    assert gated == pytest.approx(BURST_S / (0.4 - allowed(0.1)), abs=PERIOD)
    assert ungated == pytest.approx(BURST_UNGATED_S / (0.4 - allowed(0.1)), abs=PERIOD)
    assert found[0].burst == BURST_UNGATED_S and "through no gate" in found[0].describe()
    # Unknown (no slots read): every pid is taken as gated.
    unknown, _ = _first_found(Checker(), [lim(0.1)], {1: 0.4}, owner, hooked=None)
    assert unknown == gated


def test_an_ungated_helper_within_the_jobs_share_costs_nothing():
    """A process of the job that left the hook out (a child started with a
    clean environment) but keeps the job within its share: no debt at all."""
    c = Checker()
    owner = {(GPU, 1): "1", (GPU, 2): "1"}
    t, _ = _first_found(c, [lim(0.3)], {1: 0.25, 2: 0.05}, owner, hooked={1}, seconds=60.0)
    assert t is None


def test_a_job_that_may_borrow_may_use_what_the_promises_leave_open():
    """A job with no share beside a hard 60 % one (issue 30: its budget was
    the whole GPU): what the 60 % job leaves, and no more."""
    owner = {(GPU, 1): "a", (GPU, 2): "b"}
    promised = lim(0.6, job="a", uid=1)
    borrower = JobLimits("b", GPU, G, 0.0, 2, borrows=True)
    # the promised job busy, the borrower in what is left: never a violation
    t, _ = _first_found(Checker(), [promised, borrower], {1: 0.6, 2: 0.38}, owner, {1, 2},
                        seconds=60.0)
    assert t is None
    # the promised job idle: the borrower may have the whole GPU
    t, _ = _first_found(Checker(), [promised, borrower], {2: 1.0}, owner, {1, 2}, seconds=60.0)
    assert t is None
    # past what is left, as a gated job past its share
    t, found = _first_found(Checker(), [promised, borrower], {1: 0.6, 2: 0.6}, owner, {1, 2})
    assert t == pytest.approx(BURST_S / (0.6 - allowed(0.4)), abs=PERIOD)
    assert [(v.job_id, v.scope) for v in found] == [("b", "job")]
    assert "over its share of 0% and what the others' promises left open" in found[0].describe()


TURNS = dict(turn=0.6)


def test_where_jobs_take_turns_work_past_a_hook_beyond_its_own_turn_is_a_violation():
    """Work past the hook time-slices with the turn's holder, whose own
    measure then holds it: the split can't see how much it took, so none is
    allowed beyond what the job's own turn left unused."""
    owner = {(GPU, 1): "a", (GPU, 2): "b", (GPU, 3): "b"}
    promised = JobLimits("a", GPU, G, 0.6, 1, turn=0.6)
    # no share, so no turn: 5 % past its hook is found within its burst
    borrower = JobLimits("b", GPU, G, 0.0, 2, borrows=True)
    t, found = _first_found(Checker(), [promised, borrower], {1: 0.6, 3: 0.05}, owner, {1, 2})
    assert t == pytest.approx(BURST_UNGATED_S / (0.05 - 0.01), abs=PERIOD)
    assert [(v.job_id, v.scope, v.limit) for v in found] == [("b", BYPASS, 0.0)]
    assert "past their hooks" in found[0].describe()
    # with no turn on the GPU (no promise) the same is within what is open
    free = JobLimits("a", GPU, G, 0.0, 1, borrows=True)
    t, _ = _first_found(Checker(), [free, borrower], {1: 0.6, 3: 0.05}, owner, {1, 2},
                        seconds=30.0)
    assert t is None
    # the only turn on the GPU its own user's: no one else's turn to land in
    own = JobLimits("a", GPU, G, 0.6, 2, turn=0.6)
    t, _ = _first_found(Checker(), [own, borrower], {1: 0.6, 3: 0.05}, owner, {1, 2},
                        seconds=30.0)
    assert t is None
    # a helper that left the hook out, within the unused part of its job's turn
    mine = JobLimits("b", GPU, G, 0.3, 2, turn=0.3)
    t, _ = _first_found(Checker(), [JobLimits("a", GPU, G, 0.6, 1, turn=0.6), mine],
                        {1: 0.6, 2: 0.2, 3: 0.08}, owner, {1, 2}, seconds=30.0)
    assert t is None


def test_ungated_min_is_the_noise_floor_of_work_past_a_hook():
    """UNGATED_MIN too high: a burner past its hook at a few percent beside
    another user's turn is never found; too low: NVML's rounding of an idle
    context (half a percent) would end an honest job under protect."""
    owner = {(GPU, 1): "a", (GPU, 3): "b"}
    limits = [JobLimits("a", GPU, G, 0.6, 1, turn=0.6),
              JobLimits("b", GPU, G, 0.0, 2, borrows=True)]
    t, _ = _first_found(Checker(), limits, {1: 0.6, 3: 0.005}, owner, {1}, seconds=120.0)
    assert t is None
    t, found = _first_found(Checker(), limits, {1: 0.6, 3: 0.03}, owner, {1}, seconds=120.0)
    assert t is not None and t < 10.0 and found[0].scope == BYPASS


def test_work_past_the_hooks_of_many_small_jobs_adds_up_per_user():
    """Eight jobs of one user each 1 % past its hook (under the noise floor
    each): together 8 %."""
    limits = [JobLimits("a", GPU, G, 0.6, 1, turn=0.6)]
    owner = {(GPU, 1): "a"}
    busy = {1: 0.6}
    for k in range(8):
        limits.append(JobLimits(f"s{k}", GPU, G, 0.0, 2, borrows=True))
        owner[(GPU, 10 + k)] = f"s{k}"
        busy[10 + k] = 0.011
    t, found = _first_found(Checker(), limits, busy, owner, {1})
    assert t is not None and t < 3.0
    assert sorted(v.job_id for v in found) == [f"s{k}" for k in range(8)]


def test_busy_time_no_job_claims_is_a_violation():
    c = Checker()
    found = []
    for w in windows(0.0, 3.0, {999: 0.8}):
        found, _ = c.check(w.end, [lim()], {}, [w], {(GPU, 999): None})
        if found:
            break
    assert [(v.kind, v.pid, v.job_id, v.share_unit) for v in found] == [(NO_JOB, 999, None,
                                                                         True)]


def test_a_compute_violation_lasts_until_its_debt_is_paid_and_is_new_once():
    c = Checker()
    owner = {(GPU, 1): "1"}
    news = 0
    for w in windows(0.0, 3.0, {1: 1.0}):
        news += len(c.check(w.end, [lim(0.1)], {}, [w], owner)[1])
    assert news == 1
    found = True
    t = 3.0
    while found:
        w = windows(t, PERIOD, {})[0]
        found = c.check(w.end, [lim(0.1)], {}, [w], owner)[0]
        t = w.end
    assert t < 3.0 + 20.0


# -- what is done ----------------------------------------------------------------------------
def _memory_case():
    """A 4 GiB job holding 12 GiB (a bypass), an 8 GiB job holding 0.3 on a
    16 GiB GPU with 12.6 in use."""
    limits = [lim(mem=4 * G, job="a"), lim(mem=8 * G, job="b", uid=2000)]
    c = Checker()
    mem = {GPU: {1: 12 * G, 2: int(0.3 * G)}}
    found, _ = c.check(0.0, limits, mem, [], {(GPU, 1): "a", (GPU, 2): "b"})
    gpus = {GPU: GpuMemory(GPU, 16 * G, int(12.6 * G))}
    held = {("a", GPU): 12 * G, ("b", GPU): int(0.3 * G)}
    return found, gpus, limits, held


def test_protect_ends_a_job_whose_overrun_takes_what_another_was_promised():
    found, gpus, limits, held = _memory_case()
    todo = act(found, PROTECT, gpus, limits, held, reserve=512 << 20)
    assert list(todo.end) == ["a"] and todo.kill == []
    assert act(found, REPORT, gpus, limits, held, 512 << 20).end == {}


def test_protect_leaves_an_overrun_that_takes_nothing_promised_and_fits_the_reserve():
    limits = [lim(mem=4 * G, job="a")]
    c = Checker()
    found, _ = c.check(0.0, limits, {GPU: {1: 4 * G + (100 << 20)}}, [], {(GPU, 1): "a"})
    gpus = {GPU: GpuMemory(GPU, 16 * G, 4 * G + (100 << 20))}
    todo = act(found, PROTECT, gpus, limits, {("a", GPU): 4 * G + (100 << 20)}, 512 << 20)
    assert todo.end == {} and [v.kind for v in found] == [MEMORY]
    assert list(act(found, KILL, gpus, limits, {}, 512 << 20).end) == ["a"]


def test_protect_kills_a_process_in_no_job_only_where_it_takes_promised_memory():
    limits = [lim(mem=8 * G, job="b")]
    c = Checker()
    found, _ = c.check(0.0, limits, {GPU: {9: 10 * G}}, [], {(GPU, 9): None})
    short = {GPU: GpuMemory(GPU, 16 * G, 10 * G)}     # 6 free, 8 promised
    assert [v.pid for v in act(found, PROTECT, short, limits, {}, 512 << 20).kill] == [9]
    ample = {GPU: GpuMemory(GPU, 32 * G, 10 * G)}     # however much it holds: no one is short
    assert act(found, PROTECT, ample, limits, {}, 512 << 20).kill == []


def test_protect_never_ends_a_job_for_the_drivers_own_growth():
    """A job at its limit whose context the driver grew by 40 MiB (a
    kernel's local memory, which the hook can't see), on a full GPU."""
    limits = [lim(mem=8 * G, job="a"), lim(mem=7 * G, job="b", uid=2000)]
    held = 8 * G + (40 << 20)
    c = Checker()
    found, _ = c.check(0.0, limits, {GPU: {1: held, 2: 6 * G}}, [],
                       {(GPU, 1): "a", (GPU, 2): "b"})
    full = {GPU: GpuMemory(GPU, 16 * G, held + 6 * G + G)}      # b is short of 40 MiB
    assert [v.kind for v in found] == [MEMORY]
    assert act(found, PROTECT, full, limits, {("a", GPU): held, ("b", GPU): 6 * G},
               512 << 20).end == {}


def test_protect_reports_compute_and_kill_ends_the_job():
    c = Checker()
    found = []
    for w in windows(0.0, 3.0, {1: 1.0}):
        found, _ = c.check(w.end, [lim(0.1)], {}, [w], {(GPU, 1): "1"})
    gpus = {GPU: GpuMemory(GPU, 16 * G, 0)}
    assert act(found, PROTECT, gpus, [lim(0.1)], {}, 0).end == {}
    assert list(act(found, KILL, gpus, [lim(0.1)], {}, 0).end) == ["1"]


def test_protect_ends_a_job_whose_work_went_past_its_hook_where_jobs_take_turns():
    owner = {(GPU, 1): "a", (GPU, 2): "b"}
    limits = [JobLimits("a", GPU, G, 0.6, 1, turn=0.6), lim(0.1, job="b", uid=2)]
    _, found = _first_found(Checker(), limits, {1: 0.6, 2: 0.4}, owner, {1})
    gpus = {GPU: GpuMemory(GPU, 16 * G, 0)}
    assert {v.scope for v in found} >= {BYPASS}
    assert list(act(found, PROTECT, gpus, limits, {}, 0).end) == ["b"]
    assert act(found, REPORT, gpus, limits, {}, 0).end == {}


def test_cooldown_holds_a_users_new_jobs_after_repeated_ends():
    cd = Cooldown()
    assert cd.held_until(7, 0.0, after=2, hold_s=600) is None
    cd.note(7, 10.0)
    assert cd.held_until(7, 11.0, 2, 600) is None
    cd.note(7, 20.0)
    assert cd.held_until(7, 21.0, 2, 600) == 620.0
    assert cd.held_until(8, 21.0, 2, 600) is None
    assert cd.held_until(7, 621.0, 2, 600) is None
    assert cd.held_until(7, 21.0, 2, 0) is None      # 0: off
