"""Turns (vgpuctl.core.turns): how a GPU's time is divided among the jobs on
it, case by case; and the daemon's side that plans them every tick
(vgpuctl.daemon.gates), driven here with a fake clock and fake counters.
Each tuned constant has a test that fails when it is wrong in a way a user
would notice."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from vgpuctl.core import turns as T
from vgpuctl.core.job import SUSPENDED, DeviceUsage, JobRecord
from vgpuctl.core.turns import (
    BORROW_NS,
    CLOSED,
    CYCLE_NS,
    MAX_OPEN,
    OPEN,
    OPEN_TURN,
    TURNS,
    Share,
    Turn,
    needs_turns,
    plan,
)
from vgpuctl.daemon import gates as G
from vgpuctl.daemon.jobs import LiveJob

C = CYCLE_NS
MS = 1_000_000
EPOCH = 123_456_789


def pct(p: int) -> int:
    """p % of the cycle, as plan() cuts it."""
    return C * p // 100


# The part of a 50 ms cycle a few turns may fill (the guard kept out).
ROOM = C - int(T.GUARD_MIN * C)


def stretched(p: int, total: int) -> int:
    """A turn of p % where the turns of a GPU no job borrows on add up to
    total %: stretched over the cycle's room in proportion."""
    return pct(p) * ROOM // pct(total)


def fields(t: Turn) -> tuple:
    """What a hook keeps to of a turn, but whom it waits for."""
    return (t.gate, t.epoch_ns, t.cycle_ns, t.start_ns, t.len_ns, t.credit_ns, t.borrow,
            t.borrow_ns, t.open)


def spans_apart(spans: list[tuple[int, int]]) -> bool:
    spans = sorted(spans)
    return all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:], strict=False))


def complement(held: list[tuple[int, int]], cycle: int = C) -> tuple[tuple[int, int], ...]:
    """The parts of [0, cycle) outside the held spans (the test's own)."""
    free = []
    at = 0
    for s, n in sorted(held):
        if s > at:
            free.append((at, s - at))
        at = max(at, s + n)
    if at < cycle:
        free.append((at, cycle - at))
    return tuple(free)


# -- plan(), case by case -------------------------------------------------------------
def test_one_hard_job_alone_gets_its_share_of_the_cycle_and_nothing_more():
    """Its credit is its share; with no one to borrow the rest of the cycle
    its turn spans the cycle (but the guard), so that a host late to feed
    the GPU has the time to spend its share."""
    [t] = plan([Share("a", 30, "hard")], EPOCH).values()
    assert fields(t) == (TURNS, EPOCH, C, 0, ROOM, pct(30), False, 0, ())
    assert t.share == pytest.approx(0.30)
    assert t.credit_ns == 3 * C // 10


def test_turns_are_stretched_only_where_no_job_borrows():
    """Two hard jobs: their turns fill the cycle's room in proportion,
    their credits their shares. A job that borrows (soft, or no share)
    beside them keeps the rest of the cycle open, and the turns their
    shares' length."""
    p = plan([Share("a", 30, "hard"), Share("b", 60, "hard")], EPOCH)
    assert (p["a"].len_ns, p["b"].len_ns) == (stretched(30, 90), stretched(60, 90))
    assert (p["a"].credit_ns, p["b"].credit_ns) == (pct(30), pct(60))
    for borrower in (Share("s", 5, "soft"), Share("f", 100, "hard")):
        q = plan([Share("a", 30, "hard"), Share("b", 60, "hard"), borrower], EPOCH)
        assert (q["a"].len_ns, q["b"].len_ns) == (pct(30), pct(60))
        assert (q["a"].credit_ns, q["b"].credit_ns) == (pct(30), pct(60))
    # a full cycle has nothing to stretch over
    r = plan([Share("a", 40, "hard"), Share("b", 60, "hard")], EPOCH)
    assert r["a"].len_ns + r["b"].len_ns <= ROOM and r["a"].len_ns == r["a"].credit_ns


def test_two_hard_jobs_get_turns_apart():
    p = plan([Share("a", 30, "hard"), Share("b", 60, "hard")], EPOCH)
    a, b = p["a"], p["b"]
    assert (a.start_ns, a.len_ns, a.credit_ns) == (0, stretched(30, 90), pct(30))
    assert (b.start_ns, b.len_ns, b.credit_ns) == (stretched(30, 90), stretched(60, 90),
                                                   pct(60))
    assert spans_apart([(a.start_ns, a.len_ns), (b.start_ns, b.len_ns)])
    assert a.epoch_ns == b.epoch_ns == EPOCH and a.cycle_ns == b.cycle_ns == C
    assert not a.borrow and not b.borrow and a.open == b.open == ()


def test_a_soft_job_gets_its_turn_and_borrows_the_open_spans():
    p = plan([Share("s", 20, "soft"), Share("h", 30, "hard")], EPOCH)
    s, h = p["s"], p["h"]
    assert (s.start_ns, s.len_ns, s.credit_ns) == (0, pct(20), pct(20))
    assert (h.start_ns, h.len_ns) == (pct(20), pct(30))
    assert s.borrow and s.borrow_ns == BORROW_NS
    # the open spans: what no one's turn holds
    assert s.open == complement([(0, pct(20)), (pct(20), pct(30))]) == ((pct(50), pct(50)),)
    assert not h.borrow and h.open == () and h.borrow_ns == 0


def test_a_job_without_a_share_beside_a_hard_one_borrows_the_rest():
    p = plan([Share("free", 100, "hard"), Share("h", 20, "hard")], EPOCH)
    f, h = p["free"], p["h"]
    assert f.gate == TURNS and f.len_ns == 0 and f.credit_ns == 0 and f.share == 0
    assert f.borrow and f.borrow_ns == BORROW_NS
    assert f.open == ((pct(20), pct(80)),)                 # the open 80 %
    assert (h.start_ns, h.len_ns, h.credit_ns, h.borrow) == (0, pct(20), pct(20), False)


@pytest.mark.parametrize("members", [
    [Share("a", 30, "soft")],                  # a lone soft job may use it all
    [Share("a", 100, "soft")],
    [Share("a", 100, "hard")],                 # a lone job promised it all
    [Share("a", 100, "hard", "high")],
    [Share("a", 60, "soft", "low")],
], ids=["soft-30", "soft-100", "hard-100", "high-100", "low-soft-60"])
def test_a_lone_job_that_needs_no_turns_is_not_gated(members):
    """The launch fast path: a job alone on its GPU with no hard cap has
    no turns."""
    assert not needs_turns(members)
    assert set(plan(members, EPOCH).values()) == {OPEN_TURN}
    assert OPEN_TURN.gate == OPEN


@pytest.mark.parametrize("members", [
    [Share("a", 99, "hard")],                  # a hard share is a cap even alone
    [Share("a", 30, "soft"), Share("b", 100, "hard")],
    [Share("a", 100, "soft"), Share("b", 1, "soft")],
])
def test_a_share_below_100_that_binds_needs_turns(members):
    assert needs_turns(members)
    assert all(t.gate == TURNS for t in plan(members, EPOCH).values())


def test_a_high_job_is_not_held_to_a_window():
    """A high job launches when it wants (the lower classes make way): its
    window is the whole cycle, and a hard share below 100 is its GPU time
    a cycle; it takes no span from the others' turns."""
    p = plan([Share("hi", 40, "hard", "high"), Share("n", 30, "hard")], EPOCH)
    hi, n = p["hi"], p["n"]
    assert (hi.gate, hi.start_ns, hi.len_ns, hi.credit_ns) == (TURNS, 0, C, pct(40))
    assert hi.share == pytest.approx(0.40) and not hi.borrow and hi.open == ()
    assert (n.start_ns, n.len_ns, n.credit_ns) == (0, ROOM, pct(30))   # from 0, stretched


@pytest.mark.parametrize("share,policy", [(40, "soft"), (100, "hard"), (100, "soft")])
def test_a_high_job_without_a_hard_cap_is_not_held_back(share, policy):
    """Not gated at all, or gated with the whole cycle for its turn and a
    GPU time a cycle it never reaches."""
    p = plan([Share("hi", share, policy, "high"), Share("n", 30, "hard")], EPOCH)
    hi = p["hi"]
    assert hi == OPEN_TURN or (
        hi.gate == TURNS and (hi.start_ns, hi.len_ns) == (0, hi.cycle_ns)
        and hi.credit_ns >= hi.cycle_ns), hi
    assert p["n"].gate == TURNS and (p["n"].start_ns, p["n"].credit_ns) == (0, pct(30))


def test_low_jobs_turns_come_after_the_normal_ones():
    p = plan([Share("low", 30, "hard", "low"), Share("n1", 20, "hard"),
              Share("n2", 30, "soft")], EPOCH)
    assert (p["n1"].start_ns, p["n1"].len_ns) == (0, pct(20))
    assert (p["n2"].start_ns, p["n2"].len_ns) == (pct(20), pct(30))
    assert (p["low"].start_ns, p["low"].len_ns, p["low"].credit_ns) == (pct(50), pct(30),
                                                                        pct(30))


def test_low_jobs_shrink_to_what_is_left():
    """A low job's share is best effort: its turn is what the normal jobs'
    promises leave, never a part of theirs."""
    p = plan([Share("n", 80, "hard"), Share("l1", 15, "hard", "low"),
              Share("l2", 30, "soft", "low"), Share("l3", 10, "hard", "low")], EPOCH)
    # the normal job keeps all of its 80 %, whatever the low ones asked
    assert (p["n"].start_ns, p["n"].len_ns, p["n"].credit_ns) == (0, pct(80), pct(80))
    lows = [p["l1"], p["l2"], p["l3"]]
    assert all(t.start_ns >= pct(80) for t in lows if t.len_ns)
    assert all(t.credit_ns == t.len_ns for t in lows)
    # the low ones share what is left (the cycle's last 20 %, the hand-over
    # guard aside), in proportion to their shares
    assert sum(t.len_ns for t in lows) <= pct(20)
    assert p["l2"].len_ns >= p["l1"].len_ns >= p["l3"].len_ns
    assert abs(p["l2"].len_ns - 2 * p["l1"].len_ns) <= 2
    assert p["l3"].len_ns < pct(10) and not p["l3"].borrow and p["l2"].borrow
    spans = [(t.start_ns, t.len_ns) for t in p.values() if t.len_ns]
    assert spans_apart(spans) and sum(n for _, n in spans) < C


def test_an_idle_jobs_turn_is_lent_but_it_keeps_it():
    ms = [Share("idle", 30, "hard", idle=True), Share("busy", 20, "hard"),
          Share("free", 100, "hard")]
    p = plan(ms, EPOCH)
    # the idle job keeps its own turn: it launches there as soon as it comes back
    assert (p["idle"].start_ns, p["idle"].len_ns, p["idle"].credit_ns) == (0, pct(30), pct(30))
    assert p["idle"].gate == TURNS
    # its turn is open to the borrowers; the busy job's is not
    assert p["free"].open == ((0, pct(30)), (pct(50), pct(50)))
    # a busy job and an idle one: the same turns, only the open spans differ
    awake = plan([Share("idle", 30, "hard"), *ms[1:]], EPOCH)
    assert awake["idle"] == p["idle"] and awake["busy"] == p["busy"]
    assert awake["free"].open == ((pct(50), pct(50)),)


def test_adjacent_idle_turns_make_one_open_span():
    p = plan([Share("i1", 10, "hard", idle=True), Share("i2", 10, "hard", idle=True),
              Share("b", 10, "hard"), Share("s", 10, "soft")], EPOCH)
    assert p["s"].open == ((0, pct(20)), (pct(40), pct(60)))


def test_at_most_max_open_spans_the_longest_kept():
    # 21 turns of 2 %, every other one idle: ten 1 ms spans lent, and the
    # cycle's unpromised 58 %: eleven open spans, more than region.h holds.
    ms = [Share(i, 2, "hard", idle=i % 2 == 1) for i in range(21)]
    ms.append(Share("free", 100, "hard"))
    p = plan(ms, EPOCH)
    cyc = p["free"].cycle_ns
    all_open = complement([(p[i].start_ns, p[i].len_ns) for i in range(0, 21, 2)], cyc)
    assert len(all_open) == 11 > MAX_OPEN
    got = p["free"].open
    assert len(got) == MAX_OPEN
    assert set(got) <= set(all_open)                      # real gaps, none invented
    assert (cyc * 42 // 100, cyc - cyc * 42 // 100) in got   # the longest is kept
    assert list(got) == sorted(got) and spans_apart(list(got))
    dropped = set(all_open) - set(got)
    assert max(n for _, n in dropped) <= min(n for _, n in got)


def test_64_jobs_at_1_percent_all_get_turns_apart():
    ms = [Share(i, 1, "hard") for i in range(64)]
    p = plan(ms, EPOCH)
    assert len(p) == 64
    cyc = p[0].cycle_ns
    one = cyc // 100
    room = cyc - max(T.GUARD_NS * 64, int(T.GUARD_MIN * cyc))
    turn = one * room // (64 * one)           # stretched: no job borrows
    for i in range(64):
        t = p[i]
        assert (t.gate, t.cycle_ns, t.start_ns, t.len_ns, t.credit_ns) == (
            TURNS, cyc, i * turn, turn, one)
        assert t.share == pytest.approx(0.01)
    assert spans_apart([(t.start_ns, t.len_ns) for t in p.values()])
    assert max(t.start_ns + t.len_ns for t in p.values()) == 64 * turn <= cyc


def test_the_turn_after_waits_for_the_one_before():
    """Each turn names the job of the turn before it (its signal, which the
    hook waits on while that job's work is still in flight), idle or not (a
    job going idle changes no one else's turn: an idle one has nothing in
    flight to wait for), and a turn alone waits on no one."""
    sig = {"a": (11, 0), "b": (22, 1), "c": (33, 0)}
    p = plan([Share("a", 30, "hard"), Share("b", 20, "hard"), Share("c", 10, "hard")],
             EPOCH, signal_of=lambda k: sig[k])
    assert (p["b"].prev_signal_id, p["c"].prev_signal_id) == (11, 22)
    assert p["c"].prev_dev == 1
    q = plan([Share("a", 30, "hard", idle=True), Share("b", 20, "hard"),
              Share("c", 10, "hard", idle=True)], EPOCH, signal_of=lambda k: sig[k])
    assert all(q[k].prev_signal_id == p[k].prev_signal_id for k in "abc")
    [t] = plan([Share("a", 30, "hard")], EPOCH, signal_of=lambda k: sig[k]).values()
    assert t.prev_signal_id == -1


def test_borrowed_work_waits_for_the_job_before_each_open_span():
    """Each open span names the job whose held turn ends where it begins
    (across the cycle's start too, and past an idle job's lent turn), so
    that borrowed work does not time-slice with that job's overrun and count
    in its spans; a borrower is never told to wait for itself."""
    sig = {"a": (11, 0), "b": (22, 1), "i": (33, 0), "s": (44, 0), "f": (55, 0)}
    p = plan([Share("a", 20, "hard"), Share("i", 10, "hard", idle=True),
              Share("b", 30, "hard"), Share("s", 20, "soft"), Share("f", 100, "hard")],
             EPOCH, signal_of=lambda k: sig[k])
    # a 0-20, i 20-30 (idle: lent), b 30-60, s 60-80, the rest 80-100 open
    assert p["f"].open == ((pct(20), pct(10)), (pct(80), pct(20)))
    assert p["f"].open_prev == ((11, 0), (44, 0))     # after a; after s
    assert p["s"].open_prev == ((11, 0), (-1, 0))     # after itself: none
    assert p["a"].open_prev == () and p["b"].open_prev == ()   # hard: no borrowing
    # an open span that begins the cycle follows the last held turn
    q = plan([Share("x", 100, "hard"), Share("i", 20, "hard", idle=True),
              Share("b", 30, "hard")], EPOCH, signal_of=lambda k: sig.get(k, (66, 0)))
    assert q["x"].open == ((0, pct(20)), (pct(50), pct(50)))
    assert q["x"].open_prev == ((22, 1), (22, 1))


def test_the_cycle_is_the_one_asked_for():
    p = plan([Share("a", 25, "hard"), Share("b", 100, "soft")], EPOCH, cycle_ns=8 * MS,
             borrow_ns=MS // 4)
    assert (p["a"].cycle_ns, p["a"].len_ns) == (8 * MS, 2 * MS)
    assert p["b"].open == ((2 * MS, 6 * MS),) and p["b"].borrow_ns == MS // 4


def test_gate_values_are_region_hs():
    """The values the hook reads (region.h) are the ones plan() writes."""
    import re

    from vgpuctl.system import native

    text = native.region_header().read_text()

    def define(name: str) -> int:
        m = re.search(rf"^#define\s+{name}\s+(\d+)\b", text, re.M)
        assert m is not None, name
        return int(m.group(1))
    assert (OPEN, TURNS, CLOSED) == (define("VGPU_GATE_OPEN"), define("VGPU_GATE_TURNS"),
                                     define("VGPU_GATE_CLOSED"))
    assert MAX_OPEN == define("VGPU_MAX_OPEN")
    assert T.CLOSED_TURN.gate == CLOSED


# -- the tuned constants of vgpuctl.core.turns -----------------------------------------
def test_cycle_no_job_waits_long_for_its_turn():
    """CYCLE_NS (or MIN_TURN_NS) too long: a job at a small share (an
    inference server at --core 10) waits nearly a cycle between its turns,
    and its requests stall that long. A tenth of a second is already felt."""
    for share in (10, 30, 50):
        p = plan([Share("a", share, "hard"), Share("b", 100 - share, "hard")], EPOCH)
        t = p["a"]
        assert t.cycle_ns - t.len_ns <= 100 * MS, (share, t)


def test_cycle_a_small_turn_holds_a_few_kernels():
    """CYCLE_NS too short: a turn at --core 10 holds less than a few
    millisecond kernels (vgpu-burn's, a training step's), so nearly every
    launch runs past its turn into the next job's and is paid back later:
    the shares come in bursts and neighbours wait for kernels not theirs."""
    [t] = plan([Share("a", 10, "hard")], EPOCH).values()
    assert t.len_ns >= 4 * MS, t


def test_min_turn_a_tiny_share_still_gets_a_turn_a_late_thread_can_use():
    """MIN_TURN_NS too short: at --core 1 a turn of half a millisecond is
    missed whole by a launching thread the host woke a little late, and the
    job runs well below its share. Its turn is a millisecond at least."""
    for share in (1, 2, 3):
        p = plan([Share("tiny", share, "hard"), Share("big", 100 - share, "hard")], EPOCH)
        assert p["tiny"].len_ns >= 1 * MS, (share, p["tiny"])
        assert p["tiny"].share == pytest.approx(share / 100, rel=0.02)


def test_max_cycle_no_share_stretches_the_cycle_past_half_a_second():
    """MAX_CYCLE_NS too long: the cycle grown for a tiny share makes every
    other job on the GPU wait that long between turns. (With shares in whole
    percents and MIN_TURN_NS as it is, the cycle grows to 200 ms at most:
    the bound is checked on a cycle asked for longer.)"""
    for share in (1, 2):
        p = plan([Share("tiny", share, "hard"), Share("b", 50, "hard")], EPOCH)
        assert p["b"].cycle_ns - p["b"].len_ns <= 500 * MS
    assert T.cycle_for([Share("tiny", 1, "hard")], cycle_ns=5_000 * MS) <= 500 * MS


def test_guard_promises_that_fill_the_gpu_lose_little_to_the_hand_over():
    """GUARD_NS/GUARD_MIN: turns that would fill the cycle leave a little
    of it for handing the GPU over; too much of it and jobs promised 50/50
    see less than they were promised, too little and a turn carried past
    its end runs into the next job's."""
    for shares in ([50, 50], [25] * 4, [10] * 10, [60, 40], [2] * 50):
        p = plan([Share(i, s) for i, s in enumerate(shares)], EPOCH)
        for i, s in enumerate(shares):
            assert p[i].share >= s / 100 * 0.97, (shares, p[i])
        spans = [(t.start_ns, t.len_ns) for t in p.values()]
        assert spans_apart(spans)
        # a hand-over a turn (tens of microseconds), and room a cycle for a
        # short kernel carried past a turn's end
        left = p[0].cycle_ns - sum(n for _, n in spans)
        assert left >= max(20_000 * len(shares), 200_000), (shares, left)


def test_cycle_a_measured_share_spans_many_cycles():
    """ps's measured share (GPU time over WINDOW_S) must not swing with
    where in the cycle a tick falls: the window holds many cycles."""
    assert G.WINDOW_S * 1e9 >= 10 * CYCLE_NS


def test_borrow_a_job_coming_back_waits_little_for_its_turn():
    """BORROW_NS too big: what a borrower keeps in flight in an open span
    delays the job whose turn begins; more than a quarter of a --core 10
    turn is felt as a share that runs late."""
    p = plan([Share("a", 10, "hard"), Share("b", 100, "soft")], EPOCH)
    assert p["b"].borrow_ns == BORROW_NS
    assert p["b"].borrow_ns <= p["a"].len_ns // 4


def test_borrow_a_borrower_keeps_the_gpu_busy_in_the_open():
    """BORROW_NS too small: a borrower gets one small kernel in flight at a
    time, and the GPU idles between its launches in the open spans: a
    borrower keeps at least two quarter-millisecond kernels queued."""
    p = plan([Share("a", 10, "hard"), Share("b", 100, "hard")], EPOCH)
    assert p["b"].borrow_ns >= 2 * MS // 4


# -- vgpuctl.daemon.gates, with a fake clock --------------------------------------------
GPU = "GPU-00000000-0000-0000-0000-00000000000a"


class FakeTable:
    def __init__(self) -> None:
        self.jobs: dict[str, LiveJob] = {}

    def __iter__(self):
        return iter(list(self.jobs.values()))

    def find(self, job_id: str) -> LiveJob | None:
        return self.jobs.get(job_id)


class FakeTrust:
    """What the daemon's region trust does for the gates: each job's
    counters as read (here, set by the test), and the gates written."""

    def __init__(self) -> None:
        self.counters: dict[str, DeviceUsage] = {}
        self.writes = 0

    def read(self, job: LiveJob) -> list[DeviceUsage]:
        job.usage = [self.counters.get(job.id, DeviceUsage())]
        return job.usage

    def write_gate(self, job: LiveJob, i: int, turn: Turn) -> None:
        while len(job.turns) <= i:
            job.turns.append(OPEN_TURN)
        if job.turns[i] != turn:
            self.writes += 1
        job.turns[i] = turn


class Node:
    """One GPU, its jobs, and the daemon's gates over them at a fake time."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.table = FakeTable()
        self.trust = FakeTrust()
        self.gates = G.Gates(self.table, self.trust, clock=lambda: self.now)  # type: ignore[arg-type]

    def add(self, job_id: str, core: int = 100, policy: str = "hard",
            priority: str = "normal") -> LiveJob:
        rec = JobRecord(name=job_id, uid=1000, user="u", command=["x"], cwd="/",
                        gpus=[{"index": 0, "uuid": GPU}], mem_limit=1 << 30, core_share=core,
                        policy=policy, created=0.0, id=job_id, priority=priority,
                        core_promised=core < 100)
        region = SimpleNamespace(signal_id=1000 + len(self.table.jobs))
        job = LiveJob(rec, region=region)  # type: ignore[arg-type]
        self.table.jobs[job_id] = job
        self.gates.replan()
        return job

    def counters(self, job_id: str, busy_ns: int, launches: int) -> None:
        self.trust.counters[job_id] = DeviceUsage(busy_ns=busy_ns, launches=launches)

    def tick(self, dt: float = 0.1) -> None:
        self.now += dt
        self.gates.step(self.gates.inputs())


def test_gates_plan_the_jobs_turns_when_they_come():
    node = Node()
    a = node.add("a", 30)
    assert [fields(t) for t in a.turns] == [
        fields(plan([Share(("a", 0), 30)], a.turns[0].epoch_ns)[("a", 0)])]
    assert a.target[GPU] == pytest.approx(0.30)
    b = node.add("b")
    assert b.turns[0].open == ((pct(30), pct(70)),) and b.target[GPU] == 1.0   # no turn: its cap
    assert a.turns[0].epoch_ns == b.turns[0].epoch_ns     # one cycle for the GPU


def test_gates_rewrite_nothing_on_a_steady_tick():
    node = Node()
    node.add("a", 30)
    node.add("b", 50, "soft")
    for k in range(5):
        node.counters("a", k * MS, k)
        node.counters("b", k * MS, k)
        node.tick()
    writes = node.trust.writes
    for k in range(5, 9):
        node.counters("a", k * MS, k)
        node.counters("b", k * MS, k)
        node.tick()
    assert node.trust.writes == writes


def lent(node: Node, job: LiveJob, borrower: LiveJob) -> bool:
    """Whether job's turn is open to the borrower now; job keeps it either way."""
    t = job.turns[0]
    assert t.gate == TURNS and t.len_ns == t.credit_ns > 0
    return any(s <= t.start_ns and t.start_ns + t.len_ns <= s + n
               for s, n in borrower.turns[0].open)


def test_idle_a_job_that_launched_within_idle_s_keeps_its_turn_unlent():
    node = Node()
    a, free = node.add("a", 30), node.add("free")
    node.counters("a", 0, 1)
    node.tick()
    node.now += G.IDLE_S - 0.05
    node.tick(0.0)
    assert not lent(node, a, free)
    node.tick(0.1)                                   # now idle for longer than IDLE_S
    assert lent(node, a, free)
    # and taken back at the first tick that sees it launch again
    node.counters("a", 5 * MS, 2)
    node.tick()
    assert not lent(node, a, free)
    assert free.turns[0].open == ((pct(30), pct(70)),)


def test_idle_a_job_between_steps_does_not_lend_its_turn():
    """IDLE_S too short: a job that launches every few ticks (a step
    waiting for its data, an inference server between requests) would be
    lent and taken back over and over, its borrowers' schedule rewritten
    every tick. A job launching every 0.3 s is never lent."""
    node = Node()
    a, free = node.add("a", 30), node.add("free")
    launches = 0
    for k in range(60):
        if k % 3 == 0:
            launches += 1
        node.counters("a", launches * MS, launches)
        node.tick(0.1)
        assert not lent(node, a, free), k


def test_idle_a_quiet_jobs_turn_is_lent_within_a_second():
    """IDLE_S too long: a job that stopped launching (its run ended, it
    waits for input) holds its turn from the jobs that could use it; they
    get it within a second."""
    node = Node()
    a, free = node.add("a", 30), node.add("free")
    for k in range(10):
        node.counters("a", k * MS, k)
        node.tick(0.1)
    stopped = node.now
    while not lent(node, a, free):
        node.tick(0.1)
        assert node.now - stopped <= 1.0 + 1e-9, "still not lent"


def test_a_job_new_to_the_gpu_is_not_idle_at_once():
    """A job just admitted has launched nothing yet: its turn is its own
    from the start (it is about to launch), not lent."""
    node = Node()
    node.add("free")
    node.tick()
    a = node.add("a", 30)
    free = node.table.find("free")
    node.tick()
    assert not lent(node, a, free)


def hook_busy(t: float, turn: Turn) -> int:
    """A hook's GPU time at t (seconds since the epoch) for a job that uses
    its credit from each turn's start and nothing else: it grows through
    that part of each turn, and stands still between."""
    k, pos = divmod(int(t * 1e9), turn.cycle_ns)
    return k * turn.credit_ns + min(max(pos - turn.start_ns, 0), turn.credit_ns)


def measured_shares(neighbours: list[int], ticks: int = 120) -> list[float]:
    """A 30 % job's measured share at each tick after the first 1.5 s, its
    ticks late or early, beside jobs of these shares."""
    node = Node()
    a = node.add("a", 30)
    for k, share in enumerate(neighbours):
        node.add(f"n{k}", share)
    rng = random.Random(7)
    t0 = node.now
    seen = []
    for k in range(ticks):
        dt = 0.1 + rng.uniform(-0.04, 0.04)          # a tick late or early
        node.counters("a", hook_busy(node.now + dt - t0, a.turns[0]), k)
        node.tick(dt)
        if node.now - t0 > 1.5:
            seen.append(a.measured[GPU])
            assert node.gates.measured("a", GPU) == a.measured[GPU]
    return seen


def test_window_the_measured_share_reads_steady():
    """WINDOW_S too short: the measured share (ps, the metrics) swings with
    where in its cycles a late or early tick falls, well off the share the
    job keeps to."""
    seen = measured_shares([])
    assert all(abs(m - 0.30) <= 0.03 for m in seen), (min(seen), max(seen))


def test_window_the_measured_share_reads_steady_beside_a_tiny_share():
    """The same with a --core 1 job on the GPU, whose turn stretches the
    cycle (MIN_TURN_NS): the window must still hold enough cycles."""
    seen = measured_shares([1])
    assert all(abs(m - 0.30) <= 0.03 for m in seen), (min(seen), max(seen))


def test_window_a_stopped_job_reads_zero_soon():
    """WINDOW_S too long: a job that stopped still shows its old share
    for as long; within a second and a half it shows none."""
    node = Node()
    a = node.add("a", 30)
    t0 = node.now
    for k in range(30):
        node.counters("a", hook_busy(node.now + 0.1 - t0, a.turns[0]), k)
        node.tick(0.1)
    assert a.measured[GPU] == pytest.approx(0.30, abs=0.03)
    stopped = node.now
    while node.now - stopped < 1.5:
        node.tick(0.1)
    assert a.measured[GPU] <= 0.01


def test_busy_s_is_the_gpu_time_since_the_previous_tick():
    node = Node()
    node.add("a", 30)
    node.counters("a", 0, 0)
    node.tick()
    node.counters("a", 30 * MS, 10)
    node.tick()
    assert node.gates.busy_s("a", GPU) == pytest.approx(0.030)
    node.tick()
    assert node.gates.busy_s("a", GPU) == 0.0
    assert node.gates.busy_s("nobody", GPU) == 0.0


def test_an_ended_job_leaves_the_plan_and_its_neighbour_moves_up():
    node = Node()
    a, b = node.add("a", 30), node.add("b", 60)
    assert b.turns[0].start_ns == stretched(30, 90)
    del node.table.jobs["a"]
    node.tick()
    assert (b.turns[0].start_ns, b.turns[0].len_ns, b.turns[0].credit_ns) == (0, ROOM, pct(60))
    assert a.turns[0].start_ns == 0                    # (no longer written)


def test_a_suspended_job_holds_no_turn():
    node = Node()
    a, b = node.add("a", 30), node.add("b", 60)
    a.rec.state = SUSPENDED
    node.tick()
    assert (b.turns[0].start_ns, b.turns[0].credit_ns) == (0, pct(60))
    assert [i.on.job_id for i in node.gates.inputs()] == ["b"]
