"""A job's user rewrites its own usage region (the segment is theirs to
write): the daemon survives, the others keep their limits, turns, measured
shares and accounting, and the tampering job is flagged with its gate
closed where that is proof (a header overwritten, a counter that went
back); a GPU time it claims beyond any wall time bills itself alone, and
hides nothing it runs without the hook; its signal saying its work never
ends holds the next turn's job back a little at most. (It can no longer be
truncated: it is shared memory of a fixed size, not a file;
test_region_space.py.)"""

from __future__ import annotations

import threading
import time

import pytest
from support.daemon import needs_native, wait_for
from support.store import usage_rows

from vgpuctl.core import turns
from vgpuctl.core.accounting import BUSY_SLACK_S
from vgpuctl.system import native
from vgpuctl.system.region import Region
from vgpuctl.system.structs import ffi
from vgpuctl.system.turn_fields import read_turn

pytestmark = needs_native

U64_MAX = 2**64 - 1


def usage_of(daemon, job_id: str) -> Region:
    """The job's region with its usage attached read-write, as the job's
    user (here root, its creator) can."""
    return Region.open(daemon.runtime / "jobs" / job_id, writable_usage=True)


def poke(daemon, job_id: str, field: str, value: int, dev: int = 0) -> None:
    """Write one of device dev's job-wide counters, as the job's user can."""
    f = ffi()
    off = (f.offsetof("struct vgpu_usage", "dev") + dev * f.sizeof("struct vgpu_dev_usage")
           + f.offsetof("struct vgpu_dev_usage", field))
    reg = usage_of(daemon, job_id)
    try:
        reg.poke_usage(off, value.to_bytes(8, "little"))
    finally:
        reg.close()


def start(daemon, *args: str):
    """`vgpuctl run ARGS` in the background; (process, job view) once the job
    has a pid."""
    before = {j["id"] for j in daemon.jobs()}
    p = daemon.popen("run", *args)
    job = wait_for(lambda: next((j for j in daemon.jobs()
                                 if j["id"] not in before and j["pids"]), None),
                   timeout=30, what="the job to start")
    return p, job


def burn(seconds: int = 60) -> list[str]:
    return [str(native.burn_program()), "--kernel-us", "1000", "--seconds", str(seconds)]


def turn(daemon, job_id: str) -> turns.Turn:
    """The gate and turn the job's hook reads now."""
    r = Region.open(daemon.runtime / "jobs" / job_id)
    try:
        return read_turn(r, 0)
    finally:
        r.close()


def gate(daemon, job_id: str) -> int:
    return turn(daemon, job_id).gate


def spans(t: turns.Turn) -> tuple:
    """What a turn lets its job launch (whom it waits for at its start aside)."""
    return (t.gate, t.epoch_ns, t.cycle_ns, t.start_ns, t.len_ns, t.credit_ns, t.borrow,
            t.borrow_ns, t.open)


def kept(t: turns.Turn, before: turns.Turn) -> bool:
    """The neighbour keeps what its turn gave it: the same credit from the
    same start, its span no shorter (it grows where the attacker's job was
    flagged and left the plan: the turns of a GPU no job borrows on are
    stretched over the idle part of the cycle)."""
    return (spans(t)[:4] == spans(before)[:4] and t.credit_ns == before.credit_ns
            and t.len_ns >= before.len_ns and spans(t)[6:] == spans(before)[6:])


def counter(daemon, job_id: str, field: str) -> int:
    """Device 0's job-wide counter as the hook wrote it."""
    reg = usage_of(daemon, job_id)
    try:
        return getattr(reg.read_devices()[0], field)
    finally:
        reg.close()


def start_burner(daemon, core: int):
    """start() of a --core CORE job of vgpu-burn (1G)."""
    return start(daemon, "--mem", "1G", "--core", str(core), "--", *burn())


def settled(daemon, job_id: str, share: float, tol: float = 0.05) -> bool:
    m = daemon.job(job_id)["core_measured"]
    return m is not None and abs(m - share) <= tol


def wait_settled(daemon, neighbour: dict, share: float) -> None:
    """Wait (30 s at most) for the neighbour's measured share to be `share`."""
    wait_for(lambda: settled(daemon, neighbour["id"], share), timeout=30,
             what="the neighbour to settle at its share")


def billed(daemon, job_id: str) -> tuple[float, float, list]:
    """(GPU-seconds, the rows' last instant, the rows) of a job as flushed."""
    rows = usage_rows(daemon.state / "vgpu.db", job_id)
    if not rows:
        return 0.0, 0.0, []
    return sum(r.gpu_seconds for r in rows), max(r.t1 for r in rows), rows


def bill_after(daemon, job_id: str, t: float) -> tuple[float, float, list]:
    """The job's bill once a flush after t has written it (every 2 s)."""
    return wait_for(lambda: (lambda b: b if b[1] > t else None)(billed(daemon, job_id)),
                    timeout=15, what=f"job {job_id}'s usage to be flushed")


@pytest.fixture
def one_gpu(daemon_factory):
    d = daemon_factory(gpus="1x16G")
    yield d
    d.cleanup_jobs()


def test_overwriting_its_usage_header_flags_that_job_and_the_daemon_lives(one_gpu):
    daemon = one_gpu
    pv, victim = start(daemon, "--mem", "1G", "--", "sleep", "60")
    pa, attacker = start(daemon, "--mem", "1G", "--", "sleep", "60")
    reg = usage_of(daemon, attacker["id"])
    reg.poke_usage(0, b"\xff" * 16)
    reg.close()
    t0 = time.monotonic()
    flagged = wait_for(lambda: daemon.job(attacker["id"])["region_error"], timeout=2,
                       what="the overwritten region to be flagged")
    assert time.monotonic() - t0 < 2.0
    assert "header" in flagged
    assert daemon.proc.poll() is None
    assert daemon.job(victim["id"])["region_error"] is None
    assert gate(daemon, attacker["id"]) == turns.CLOSED     # its launches stop
    assert "tampered" in daemon.log.read_text()
    # Everything else still answers.
    assert daemon.cli("run", "--mem", "64M", "--", "true").returncode == 0


@pytest.mark.parametrize("field", ["peak", "used"])
def test_memory_counters_at_2_64_minus_1_stop_no_one_elses_accounting(one_gpu, field):
    daemon = one_gpu
    pv, victim = start_burner(daemon, 50)
    pa, attacker = start(daemon, "--mem", "1G", "--", "sleep", "60")
    poke(daemon, attacker["id"], field, U64_MAX)
    t_poke = time.time()

    def victim_rows_after(t: float) -> bool:
        rows = usage_rows(daemon.state / "vgpu.db", victim["id"])
        return bool(rows) and max(r.t1 for r in rows) > t and sum(
            r.gpu_seconds for r in rows) > 0
    # Flushed every 2 s: the victim's rows still advance.
    wait_for(lambda: victim_rows_after(t_poke + 2.5), timeout=10,
             what="the victim's usage to be written after the poke")
    assert daemon.job(attacker["id"])["region_error"]
    assert daemon.proc.poll() is None


@pytest.mark.parametrize("field", ["busy_ns", "launches"])
def test_a_counter_rewritten_downwards_is_caught_and_the_neighbour_runs_on(one_gpu, field):
    """The hook only adds to its GPU time and launch counters: one that went
    back is proof. The job is flagged within two seconds, its gate closed
    (its next launch fails and it ends); its neighbour keeps its turn and
    runs on at its share."""
    daemon = one_gpu
    pv, victim = start_burner(daemon, 40)
    pa, attacker = start_burner(daemon, 30)
    assert gate(daemon, attacker["id"]) == turns.TURNS
    # The daemon has read the counter grown well past what the hook adds in
    # a tick (a counter set back by less is no proof: the hook may have
    # added as much since the last read).
    wait_for(lambda: (daemon.job(attacker["id"])["gated_launches"] or 0) >= 300
             and counter(daemon, attacker["id"], field) >= (300 if field == "launches"
                                                            else 300_000_000),
             timeout=30, what="the attacker's counters to be read")
    wait_settled(daemon, victim, 0.40)
    before = turn(daemon, victim["id"])
    # what the attacker's hook reads (kept attached: the job's region goes
    # when it ends, at its first launch after the gate closed)
    limits = Region.open(daemon.runtime / "jobs" / attacker["id"])
    try:
        t0 = time.monotonic()
        poke(daemon, attacker["id"], field, 0)
        why = wait_for(lambda: daemon.job(attacker["id"])["region_error"], timeout=5,
                       what="the counter that went back to be caught")
        caught_s = time.monotonic() - t0
        assert read_turn(limits, 0) == turns.CLOSED_TURN
    finally:
        limits.close()
    assert caught_s < 2.0, caught_s
    assert "went back" in why
    pa.wait(timeout=20)
    out, err = pa.communicate()
    assert pa.returncode != 0, (out, err)
    assert "closed this job's compute gate" in err, (out, err)
    # The neighbour: not named, its turn as it was, running at its share.
    assert daemon.job(victim["id"])["region_error"] is None
    assert kept(turn(daemon, victim["id"]), before)
    assert pv.poll() is None
    wait_for(lambda: settled(daemon, victim["id"], 0.40), timeout=10,
             what="the neighbour to run on at its share")
    assert daemon.proc.poll() is None


def test_a_huge_gpu_time_bills_the_liar_no_more_than_its_wall_time(one_gpu):
    """A job that writes itself days of GPU time, and keeps it growing (no
    proof: the hook only ever adds), is billed no more than its wall time;
    its neighbour's turn, measured share and bill are its own."""
    daemon = one_gpu
    pv, victim = start_burner(daemon, 30)
    pl, liar = start(daemon, "--mem", "1G", "--core", "20", "--", "sleep", "60")
    wait_settled(daemon, victim, 0.30)
    before = turn(daemon, victim["id"])
    v0, vt0, _ = bill_after(daemon, victim["id"], time.time())
    lie = 2**50                                     # 13 days of GPU time
    shares = []
    for _ in range(40):                             # 4 s, a few days more each tick
        lie += 2**44
        poke(daemon, liar["id"], "busy_ns", lie)
        time.sleep(0.1)
        shares.append(daemon.job(victim["id"])["core_measured"])
    v1, vt1, _ = bill_after(daemon, victim["id"], time.time())
    _, _, rows = bill_after(daemon, liar["id"], vt1 - 0.5)
    # The liar: no row holds more than its wall time (and the slack a row
    # has for windows that straddle its start).
    for r in rows:
        assert r.gpu_seconds <= (r.t1 - r.t0) + BUSY_SLACK_S + 1e-6, r
    wall = max(r.t1 for r in rows) - min(r.t0 for r in rows)
    assert sum(r.gpu_seconds for r in rows) <= wall + BUSY_SLACK_S * len(rows) + 1e-6
    # The neighbour: its turn, its measured share, its bill over the attack.
    assert kept(turn(daemon, victim["id"]), before)
    assert all(s is not None and abs(s - 0.30) <= 0.06 for s in shares), shares
    assert (v1 - v0) / (vt1 - vt0) == pytest.approx(0.30, abs=0.06)
    assert daemon.job(victim["id"])["region_error"] is None and pv.poll() is None


def test_counters_at_2_64_minus_1_widen_no_gate(one_gpu):
    """Every counter of the attacker's at 2^64-1, again and again: no gate
    widens (the attacker's turn is what it was, or closed), the neighbour's
    turn is unmoved and it keeps its share."""
    daemon = one_gpu
    pv, victim = start_burner(daemon, 30)
    pa, attacker = start_burner(daemon, 20)
    wait_settled(daemon, victim, 0.30)
    # what each hook reads (kept attached: the attacker's region goes if its
    # job ends, flagged)
    alimits = Region.open(daemon.runtime / "jobs" / attacker["id"])
    vlimits = Region.open(daemon.runtime / "jobs" / victim["id"])
    va, aa = read_turn(vlimits, 0), read_turn(alimits, 0)
    assert va.gate == aa.gate == turns.TURNS
    stop = threading.Event()

    def forge() -> None:   # a thread of the attacker's job
        while not stop.is_set():
            try:
                for field in ("busy_ns", "launches", "borrowed_ns", "cost_ns", "throttled_ns"):
                    poke(daemon, attacker["id"], field, U64_MAX)
            except (OSError, ValueError):
                return      # the job ended: its region is gone
            time.sleep(0.01)
    t = threading.Thread(target=forge, daemon=True)
    t.start()
    shares = []
    try:
        end = time.monotonic() + 4.0
        while time.monotonic() < end:
            a, v = read_turn(alimits, 0), read_turn(vlimits, 0)
            assert spans(a) == spans(aa) or a.gate == turns.CLOSED, a
            assert kept(v, va), v
            shares.append(daemon.job(victim["id"])["core_measured"])
            time.sleep(0.1)
    finally:
        stop.set()
        t.join()
        alimits.close()
        vlimits.close()
    assert all(s is not None and abs(s - 0.30) <= 0.06 for s in shares), shares
    assert daemon.job(victim["id"])["region_error"] is None and pv.poll() is None
    assert daemon.proc.poll() is None


@pytest.mark.parametrize("lies", [False, True], ids=["honest", "claims-all-the-gpu"])
def test_claimed_gpu_time_hides_no_process_that_bypassed_the_hook(daemon_factory, lies):
    """The watch gives the device's busy time beyond what the hooks claim to
    the processes on the GPU that loaded no hook. A --core 10 job whose
    burner runs without the hook is caught for it; a job of the same user
    beside it, without a share (it may use the whole GPU, so no claim of its
    is over its share), that writes itself GPU time enough to cover the
    whole device's must not hide that burner."""
    daemon = daemon_factory(gpus="1x16G", config='on_violation = "kill"\n')
    try:
        pc, cover = start(daemon, "--mem", "1G", "--", "sleep", "60")
        loop = f"env -u LD_PRELOAD {burn(300)[0]} --kernel-us 1000 --seconds 300"
        p, job = start(daemon, "--mem", "1G", "--core", "10", "--", "sh", "-c", loop)
        stop = threading.Event()

        def claim() -> None:   # the covering job's thread, claiming the GPU's time
            busy = 0
            while not stop.is_set():
                busy += 100_000_000              # 0.1 s of GPU time each 20 ms
                try:
                    poke(daemon, cover["id"], "busy_ns", busy)
                except (OSError, ValueError):
                    return
                time.sleep(0.02)
        t = threading.Thread(target=claim, daemon=True)
        if lies:
            t.start()
        try:
            ended = wait_for(lambda: (lambda j: j if j["state"] == "ended" else None)(
                daemon.call("ps", job=job["id"])["jobs"][0]), timeout=30,
                what="the job with a bypass to be ended")
        finally:
            stop.set()
            if lies:
                t.join()
        assert any(v["kind"] == "compute" for v in ended["violations"]), ended["violations"]
        p.wait(timeout=30)
    finally:
        daemon.cleanup_jobs()


def test_a_job_that_says_its_work_never_ends_takes_nothing_of_the_next_turn(one_gpu):
    """The job of the turn before another's writes its signal (its own
    segment) as if its work in flight never ended: the next job waits for
    it a little at most, and keeps its share."""
    daemon = one_gpu
    pa, attacker = start_burner(daemon, 30)
    pv, victim = start_burner(daemon, 40)
    wait_settled(daemon, victim, 0.40)
    vlimits = Region.open(daemon.runtime / "jobs" / victim["id"])
    sig = Region.open(daemon.runtime / "jobs" / attacker["id"], writable_usage=True)
    try:
        assert read_turn(vlimits, 0).prev_signal_id == sig.signal_id
        f = ffi()
        off = (f.offsetof("struct vgpu_signal", "dev")
               + f.offsetof("struct vgpu_signal_dev", "busy_until_ns"))
        stop = threading.Event()

        def forge() -> None:   # a thread of the attacker's job
            while not stop.is_set():
                sig.poke_signal(off, (2**63).to_bytes(8, "little"))
                time.sleep(0.0005)
        t = threading.Thread(target=forge, daemon=True)
        t.start()
        shares = []
        try:
            time.sleep(1.5)
            for _ in range(30):
                shares.append(daemon.job(victim["id"])["core_measured"])
                time.sleep(0.1)
        finally:
            stop.set()
            t.join()
    finally:
        sig.close()
        vlimits.close()
    assert all(s is not None and abs(s - 0.40) <= 0.06 for s in shares), shares
    assert pv.poll() is None
