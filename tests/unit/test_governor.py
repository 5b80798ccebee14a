"""ComputeGovernor, the daemon's interface, against a fluid model of a GPU
and a fake NVML: ticks are steps, never sleeps, so nothing here depends on
timing. The model: each job asks for share min(1, rate * cost) (1 when
ungated, 0 when idle); when the asks add up to more than the GPU, each gets
its ask in proportion. NVML answers as NVIDIA documents it (one entry per
process per call, averaged over the sample periods newer than
lastSeenTimeStamp, in whole percents: support.fake_nvml.UtilBuffer), with
sample periods of 1/6 s or 1 s and idle periods averaged in or skipped,
while the governor ticks every 100 ms. Launches are counted only while a job
is gated, as the hook counts them in the region."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from support.fake_nvml import (
    IDLE_TREATMENTS,
    PERIOD_FAST_US,
    PERIOD_SLOW_US,
    T0,
    NVMLError,
    Sample,
    UtilBuffer,
)

from vgpuctl.governor.compute import ComputeGovernor, Gate, JobDevice

TICK = 0.1


@dataclass
class Job:
    job_id: str
    pid: int
    share: int
    policy: str = "hard"
    cost_s: float = 1e-3
    busy: bool = True           # saturating; False: idle (launches nothing)
    uuid: str = "GPU-0"
    launches: float = 0.0
    pids: frozenset[int] | None = None    # what the daemon knows of the job (default: pid)
    whole: bool = False         # kernels run whole: a tick holds a whole number of them
    carry: float = 0.0          # (whole) the part of a kernel left to the next tick
    gate: Gate | None = None
    got: list[float] = field(default_factory=list)   # true share per tick


class World:
    NVMLError = NVMLError

    def __init__(self, jobs: list[Job], capacity: float = 1.0, period_us: int = PERIOD_FAST_US,
                 idle: str = "average", procs: str = "each") -> None:
        self.jobs = jobs
        # what the GPU can fill when several processes take turns; when
        # asked for more, the jobs with the longest kernels win the race
        # for the device and the loss falls on the shortest ones
        self.capacity = capacity
        self.period_us = period_us
        self.idle = idle
        self.procs = procs
        self.now_us = T0
        self.gpus: dict[str, UtilBuffer] = {}
        self.fail = 0
        self.rng: random.Random | None = None      # whole kernels: placed at random in a tick

    # -- fake NVML --
    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return uuid

    def nvmlDeviceGetProcessUtilization(self, handle: str, last_seen: int) -> list[Sample]:
        if self.fail:
            self.fail -= 1
            raise NVMLError(999)
        if handle not in self.gpus:
            raise NVMLError(6)
        return self.gpus[handle].query(last_seen)

    # -- the GPU --
    def run_tick(self) -> None:
        self.now_us += int(TICK * 1e6)
        for uuid in {j.uuid for j in self.jobs}:
            here = [j for j in self.jobs if j.uuid == uuid]
            asks = []
            for j in here:
                if not j.busy:
                    asks.append(0.0)
                elif j.gate is None or not j.gate.throttle:
                    asks.append(1.0)
                else:
                    asks.append(min(1.0, j.gate.refill_rate / 1000.0 * j.cost_s))
            total = sum(asks)
            usable = self.capacity if sum(1 for a in asks if a > 0) > 1 else 1.0
            got = {}
            if total <= usable:
                got = {id(j): a for j, a in zip(here, asks, strict=True)}
            elif self.capacity < 1.0:
                left = usable
                for j, a in sorted(zip(here, asks, strict=True), key=lambda x: -x[0].cost_s):
                    got[id(j)] = min(a, left)
                    left -= got[id(j)]
            else:
                got = {id(j): a / total for j, a in zip(here, asks, strict=True)}
            buf = self.gpus.setdefault(uuid, UtilBuffer(self.period_us, self.idle,
                                                        procs=self.procs))
            start_us = self.now_us - TICK * 1e6
            for j in here:
                share = got[id(j)]
                kernels = share * TICK / j.cost_s
                if j.whole:
                    # whole kernels, evenly spread over the tick: NVML sees
                    # one in some periods and two in others
                    j.carry += kernels
                    kernels = float(int(j.carry))
                    j.carry -= kernels
                    share = kernels * j.cost_s / TICK
                    phase = self.rng.random() if self.rng else (j.pid % 7) / 7
                    for i in range(int(kernels)):
                        t = start_us + (i + phase) * TICK * 1e6 / kernels
                        buf.run(j.pid, t, t + j.cost_s * 1e6)
                elif share > 0:
                    buf.run(j.pid, start_us, self.now_us, share)
                j.got.append(share)
                if j.gate is not None and j.gate.throttle:
                    # as the hook: the region's device counter moves only
                    # on the gated path (the fast path counts per process)
                    j.launches += kernels
            buf.publish(self.now_us)

    def clock_us(self) -> int:
        return self.now_us


def run(world: World, gov: ComputeGovernor, ticks: int) -> dict[tuple[str, str], Gate]:
    gates: dict[tuple[str, str], Gate] = {}
    for _ in range(ticks):
        world.run_tick()
        devs = [JobDevice(j.job_id, j.uuid, j.pids or frozenset({j.pid}), j.share, j.policy,
                          int(j.launches)) for j in world.jobs]
        gates = gov.tick(devs, world.now_us / 1e6)
        for j in world.jobs:
            j.gate = gates[(j.job_id, j.uuid)]
    return gates


def governor(world: World) -> ComputeGovernor:
    return ComputeGovernor(tick_s=TICK, nvml=world, clock_us=world.clock_us)


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


# Every NVML the governor must work with: the shortest and the longest
# sample period NVIDIA documents, idle periods averaged in or skipped.
NVMLS = [pytest.param(p, i, id=f"{p // 1000}ms-{i}")
         for p in (PERIOD_FAST_US, PERIOD_SLOW_US) for i in IDLE_TREATMENTS]


def settled(period_us: int) -> int:
    """Ticks after which a new job is at its share: the first cost estimate
    needs two windows (the first starts before the job was gated), and the
    PI ignores the two after the rate jumped to it."""
    return 20 if period_us == PERIOD_FAST_US else 60


def probed(period_us: int, jobs: int) -> int:
    """Ticks after which jobs started together on a GPU whose NVML names one
    process a period have each been probed (run alone for a period) and are
    at their shares: the period learnt, then a probe a job, each up to two
    periods long and three periods apart."""
    return settled(period_us) + int(jobs * 6 * period_us / 1e6 / TICK)


def test_hard_100_is_never_gated() -> None:
    w = World([Job("1", 101, 100, "hard")])
    gov = governor(w)
    for _ in range(20):
        gates = run(w, gov, 1)
        assert gates[("1", "GPU-0")].throttle is False
    assert gates[("1", "GPU-0")].measured == pytest.approx(1.0, abs=0.011)


def test_soft_alone_is_not_gated() -> None:
    w = World([Job("1", 101, 30, "soft")])
    gates = run(w, governor(w), 20)
    assert gates[("1", "GPU-0")].throttle is False
    assert gates[("1", "GPU-0")].target == 1.0


@pytest.mark.parametrize(("period_us", "idle"), NVMLS)
@pytest.mark.parametrize("cost_s", [10e-6, 1e-3, 10e-3])
def test_hard_share_alone_is_held(cost_s: float, period_us: int, idle: str) -> None:
    j = Job("1", 101, 30, "hard", cost_s=cost_s)
    w = World([j], period_us=period_us, idle=idle)
    n = settled(period_us)
    gates = run(w, governor(w), n + 20)
    g = gates[("1", "GPU-0")]
    assert g.throttle is True
    assert g.bucket_size >= 1000                      # at least one launch
    assert mean(j.got[n:]) == pytest.approx(0.30, abs=0.01)
    assert max(j.got[n:]) <= 0.32
    assert g.measured == pytest.approx(0.30, abs=0.015)
    assert g.refill_rate == pytest.approx(0.30 / cost_s * 1000, rel=0.05)


@pytest.mark.parametrize(("period_us", "idle"), NVMLS)
def test_two_hard_jobs(period_us: int, idle: str) -> None:
    a, b = Job("1", 101, 30), Job("2", 102, 60, cost_s=5e-3)
    w = World([a, b], period_us=period_us, idle=idle)
    n = settled(period_us)
    run(w, governor(w), n + 20)
    assert mean(a.got[n:]) == pytest.approx(0.30, abs=0.01)
    assert mean(b.got[n:]) == pytest.approx(0.60, abs=0.01)


@pytest.mark.parametrize(("period_us", "idle"), NVMLS)
def test_two_hard_jobs_when_nvml_names_one_process_a_period(period_us: int, idle: str) -> None:
    """An H100 names one process a sample period, with the whole device's
    utilization (here always the busiest, 60 %): the governor once took that
    for the 60 % job's own share and 0 for the 30 % job's, and showed them;
    the device's busy time is split by what the jobs' gates account."""
    a, b = Job("1", 101, 30), Job("2", 102, 60)
    w = World([a, b], period_us=period_us, idle=idle, procs="busiest")
    n = probed(period_us, 2)
    gates = run(w, governor(w), n + 40)
    assert mean(a.got[n:]) == pytest.approx(0.30, abs=0.01)
    assert mean(b.got[n:]) == pytest.approx(0.60, abs=0.01)
    # what `ps` shows of each (the gate's measured share)
    assert gates[("1", "GPU-0")].measured == pytest.approx(0.30, abs=0.02)
    assert gates[("2", "GPU-0")].measured == pytest.approx(0.60, abs=0.02)


@pytest.mark.parametrize(("period_us", "idle"), NVMLS)
def test_jobs_of_other_kernels_started_together_are_probed(period_us: int, idle: str) -> None:
    """NVML names one process a period, and three jobs of 50 us, 500 us and
    5 ms kernels start together: no window says what any of them costs, so
    the governor holds all but one for a sample period, for each of them in
    turn, and learns each's cost (docs/compute.md, probes)."""
    a = Job("1", 101, 20, cost_s=50e-6)
    b = Job("2", 102, 30, cost_s=500e-6)
    c = Job("3", 103, 50, cost_s=5e-3)
    w = World([a, b, c], period_us=period_us, idle=idle, procs="busiest")
    n = probed(period_us, 3)
    run(w, governor(w), n + 60)
    for j in (a, b, c):
        assert mean(j.got[n:]) == pytest.approx(j.share / 100, abs=0.015), j.job_id


@pytest.mark.parametrize(("period_us", "idle"), NVMLS)
def test_a_job_joining_one_of_other_kernels_gets_its_cost_from_the_rest(period_us: int,
                                                                        idle: str) -> None:
    """NVML names one process a period; a 60 % job of 5 ms kernels joins a
    30 % job of 1 ms kernels that ran alone first (its busy time then its
    own): the newcomer's cost is what the device ran beyond the first's."""
    a = Job("1", 101, 30)
    b = Job("2", 102, 60, cost_s=5e-3, busy=False)
    w = World([a, b], period_us=period_us, idle=idle, procs="busiest")
    gov = governor(w)
    n = settled(period_us)
    run(w, gov, n)
    b.busy = True
    m = len(a.got) + settled(period_us) + 10
    run(w, gov, m - len(a.got) + 40)
    assert mean(a.got[m:]) == pytest.approx(0.30, abs=0.015)
    assert mean(b.got[m:]) == pytest.approx(0.60, abs=0.015)


@pytest.mark.parametrize(("period_us", "idle"), NVMLS)
def test_many_small_shares(period_us: int, idle: str) -> None:
    """64 jobs of 1 % each, of whole kernels at random places, whatever
    NVML's period: NVML's whole percents can't tell a period with one 1 ms
    kernel (0.6 %) from one with two (1.2 %), and no job may drift out of
    0.5..1.5 %, also when its kernels are not the 1 ms the loop first
    assumes."""
    jobs = [Job(str(i), 1000 + i, 1, cost_s=(0.7e-3, 1e-3, 1.3e-3, 2e-3)[i % 4], whole=True)
            for i in range(64)]
    w = World(jobs, period_us=period_us, idle=idle)
    w.rng = random.Random(period_us)
    n = settled(period_us)
    run(w, governor(w), n + 100)
    for j in jobs:
        assert mean(j.got[n:]) == pytest.approx(0.01, abs=0.005), j.job_id


@pytest.mark.parametrize(("period_us", "idle"), NVMLS)
def test_two_soft_jobs_share_the_whole_gpu(period_us: int, idle: str) -> None:
    a, b = Job("1", 101, 30, "soft"), Job("2", 102, 30, "soft", cost_s=2e-3)
    w = World([a, b], period_us=period_us, idle=idle)
    n = settled(period_us)
    run(w, governor(w), n + 20)
    assert mean(a.got[n:]) + mean(b.got[n:]) >= 0.95
    assert mean(a.got[n:]) == pytest.approx(0.5, abs=0.03)
    assert mean(b.got[n:]) == pytest.approx(0.5, abs=0.03)


@pytest.mark.parametrize(("period_us", "idle"), NVMLS)
def test_full_gpu_loss_is_shared_not_dumped_on_short_kernels(period_us: int, idle: str) -> None:
    # 20/30/50 hard with 50 us, 500 us and 5 ms kernels on a GPU that can
    # fill 97 % of its time when they take turns
    a = Job("1", 101, 20, cost_s=50e-6)
    b = Job("2", 102, 30, cost_s=500e-6)
    c = Job("3", 103, 50, cost_s=5e-3)
    w = World([a, b, c], capacity=0.97, period_us=period_us, idle=idle)
    n = settled(period_us) + 10
    run(w, governor(w), n + 100)                      # 10 s, as the benchmark
    for j in (a, b, c):
        assert mean(j.got[n:]) == pytest.approx(j.share / 100, abs=0.02), (a.got[-1], b.got[-1],
                                                                            c.got[-1])
    # the 3 % loss is spread: the 50 us job loses about its part of it (its
    # loss is the estimate's lag behind the GPU, a window of 1 s at most)
    assert mean(a.got[n:]) >= (0.19 if period_us == PERIOD_FAST_US else 0.185)


@pytest.mark.parametrize(("period_us", "idle"), NVMLS)
def test_soft_borrows_from_an_idle_owner_and_gives_back_within_a_second(period_us: int,
                                                                         idle: str) -> None:
    soft = Job("1", 101, 30, "soft")
    owner = Job("2", 102, 60, "hard", busy=False)
    w = World([soft, owner], period_us=period_us, idle=idle)
    gov = governor(w)
    n = settled(period_us) + 10
    run(w, gov, n)
    assert mean(soft.got[n - 10:]) >= 0.95            # the owner's share is lent
    owner.busy = True
    run(w, gov, 10)                                   # 1 s
    assert owner.got[-1] == pytest.approx(0.60, abs=0.02)
    assert soft.got[-1] == pytest.approx(0.40, abs=0.02)
    # hard: never above its share; soft keeps what nobody claims
    run(w, gov, 20)
    assert max(owner.got[n:]) <= 0.62


@pytest.mark.parametrize(("period_us", "idle"), NVMLS)
def test_hard_never_borrows(period_us: int, idle: str) -> None:
    hard = Job("1", 101, 30, "hard")
    idle_job = Job("2", 102, 60, "soft", busy=False)
    w = World([hard, idle_job], period_us=period_us, idle=idle)
    n = settled(period_us)
    run(w, governor(w), n + 20)
    assert max(hard.got[10:]) <= 0.32
    assert mean(hard.got[n:]) == pytest.approx(0.30, abs=0.01)


@pytest.mark.parametrize(("period_us", "idle"), NVMLS)
def test_live_core_change_takes_effect_within_a_second(period_us: int, idle: str) -> None:
    j = Job("1", 101, 30, "hard", cost_s=500e-6)
    w = World([j], period_us=period_us, idle=idle)
    gov = governor(w)
    n = settled(period_us) + 10
    run(w, gov, n)
    j.share = 60
    run(w, gov, 10)
    assert j.got[-1] == pytest.approx(0.60, abs=0.02)
    assert max(j.got[n:]) <= 0.62
    j.share = 20
    run(w, gov, 10)
    assert j.got[-1] == pytest.approx(0.20, abs=0.02)


@pytest.mark.parametrize(("period_us", "idle"), NVMLS)
def test_no_burst_when_an_idle_job_returns(period_us: int, idle: str) -> None:
    j = Job("1", 101, 40, "hard")
    w = World([j], period_us=period_us, idle=idle)
    gov = governor(w)
    n = settled(period_us) + 10
    run(w, gov, n)
    j.busy = False
    run(w, gov, 200)                                  # 20 s idle
    j.busy = True
    run(w, gov, 20 + n)
    assert max(j.got[n + 200:]) <= 0.42
    assert mean(j.got[-20:]) == pytest.approx(0.40, abs=0.01)


def test_gpus_are_independent_and_departed_jobs_forgotten() -> None:
    a = Job("1", 101, 30, "hard", uuid="GPU-0")
    b = Job("2", 102, 30, "soft", uuid="GPU-1")
    w = World([a, b])
    gov = governor(w)
    gates = run(w, gov, 30)
    assert gates[("1", "GPU-0")].throttle is True
    assert gates[("2", "GPU-1")].throttle is False    # alone on its GPU
    assert gates[("2", "GPU-1")].measured > 0.9
    w.jobs.remove(b)
    gates = run(w, gov, 1)
    assert set(gates) == {("1", "GPU-0")}
    # Forgotten: were it to come back, it would start from nothing measured.
    w.jobs.append(b)
    gates = run(w, gov, 1)
    assert gates[("2", "GPU-1")].measured == 0.0


def test_nvml_errors_keep_the_last_gate_and_measurement() -> None:
    j = Job("1", 101, 30, "hard")
    w = World([j])
    gov = governor(w)
    before = run(w, gov, 30)[("1", "GPU-0")]
    w.fail = 5
    after = run(w, gov, 5)[("1", "GPU-0")]
    assert after.throttle is True
    assert after.measured == before.measured
    assert after.refill_rate == pytest.approx(before.refill_rate, rel=0.05)
    run(w, gov, 10)
    assert mean(j.got[-5:]) == pytest.approx(0.30, abs=0.01)


def test_pids_gone_or_unknown_count_for_nobody() -> None:
    """NVML lists a pid of no job (another user's process, a zombie) and a
    job's pid that has gone: neither counts for the job."""
    j = Job("1", 101, 30, "hard")
    w = World([j])
    gov = governor(w)
    run(w, gov, 30)
    for _ in range(10):
        w.gpus["GPU-0"].run(999, w.now_us, w.now_us + 100_000, 0.3)   # nobody's
        run(w, gov, 1)
    assert mean(j.got[-5:]) == pytest.approx(0.30, abs=0.01)
    assert gov.tick([JobDevice("1", "GPU-0", frozenset({101}), 30, "hard", int(j.launches))],
                    w.now_us / 1e6)[("1", "GPU-0")].measured == pytest.approx(0.30, abs=0.01)
    j.pids = frozenset({555})     # its process gone, another in its place, not yet running
    gates = run(w, gov, 3)
    assert gates[("1", "GPU-0")].measured == 0.0


@pytest.mark.parametrize("late", [1, 2, 3])
@pytest.mark.parametrize("cost_s", [50e-6, 200e-6, 1e-3])
def test_gate_writes_that_land_late_are_never_taken_for_tampering(cost_s: float,
                                                                  late: int) -> None:
    """A loaded daemon writes each gate a few ticks after it computed it;
    the hook launches at the gate it has. After `set --core 60` -> 20 and
    back, the honest job launches more than the newest gate allows: that
    is no proof of anything (the tick-by-tick books it replaced said
    "launched 1193 kernels in 0.10 s, beyond the 3979.7/s its gate
    granted"). The judge is region trust's ledger, fed the same history."""
    from vgpuctl.core import trust

    a, b = Job("a", 101, 60, cost_s=cost_s), Job("b", 102, 30, cost_s=cost_s * 4)
    w = World([a, b])
    gov = governor(w)
    pending: list[dict[tuple[str, str], Gate]] = []
    ledgers = {j.job_id: trust.LaunchLedger(trust.OPEN, at=w.now_us / 1e6) for j in w.jobs} \
        if hasattr(trust, "LaunchLedger") else {}
    for k in range(200):
        a.share = 20 if 60 <= k < 120 else 60
        w.run_tick()
        now = w.now_us / 1e6
        for job_id, ledger in ledgers.items():
            j = next(x for x in w.jobs if x.job_id == job_id)
            over = ledger.read(now, now, int(j.launches))
            assert over is None or not over.proven(threads=1), over
        devs = [JobDevice(j.job_id, j.uuid, frozenset({j.pid}), j.share, j.policy,
                          int(j.launches)) for j in w.jobs]
        gates = gov.tick(devs, now)
        assert not any(getattr(g, "overrun", None) for g in gates.values())
        pending.append(gates)
        if len(pending) > late:
            written = pending.pop(0)
            for j in w.jobs:
                j.gate = g = written[(j.job_id, j.uuid)]
                if ledgers:
                    ledgers[j.job_id].wrote(now, now, trust.Gate(g.throttle, g.refill_rate,
                                                                 g.bucket_size))


@pytest.mark.parametrize("procs", ["busiest", "each"])
def test_the_violation_watch_and_the_bills_take_the_split_not_nvmls_names(procs: str) -> None:
    """The daemon's violation watch reads NVML itself and splits each window
    as the governor does: two honest hooked jobs at 30/60, while NVML names
    the 60 % one with the whole GPU's time every period, are never taken for
    an overrun over a minute, and each is billed its own GPU time."""
    from vgpuctl.core.violations import JobLimits
    from vgpuctl.daemon.violations import Known, Watch
    from vgpuctl.governor.sampler import Sampler
    from vgpuctl.system.nvml import GpuStats

    # pids no Linux process can have (above the kernel's 2^22 limit)
    a, b = Job("1", 5_000_101, 30), Job("2", 5_000_102, 60)
    w = World([a, b], procs=procs)
    gov = governor(w)
    read = Sampler(w, w.clock_us).read
    watch = Watch(lambda: [GpuStats(0, "GPU-0", "sim", 16 << 30,
                                    processes={a.pid: 1 << 30, b.pid: 1 << 30})],
                  lambda u: gov.attribute(u, read(u)), processes=gov.note_processes)
    known = Known([JobLimits("1", "GPU-0", 2 << 30, 0.3, 1000),
                   JobLimits("2", "GPU-0", 2 << 30, 0.6, 1000)],
                  {a.pid: "1", b.pid: "2"}, {}, {}, hooked={a.pid: 0, b.pid: 0})
    billed = {"1": 0.0, "2": 0.0}
    found = []
    n = settled(PERIOD_FAST_US)
    for i in range(600):
        run(w, gov, 1)
        res = watch.check(known, "kill", w.now_us / 1e6)
        found += res.found
        if i >= n:
            for (job, _), s in res.busy.items():
                billed[job] += s
    assert found == []
    ran = {j.job_id: sum(j.got[n + 1:]) * TICK for j in (a, b)}
    for job in billed:
        assert billed[job] == pytest.approx(ran[job], rel=0.05), (billed, ran)
