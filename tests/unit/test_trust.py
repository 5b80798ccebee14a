"""Region trust (vgpuctl.core.trust): a verdict that closes a job's gate rests
on proof, never on timing. The hook's token bucket is modelled here as
launch.c runs it -- a lazy refill at the rate it last read, threads that
stall anywhere (between reading the gate and refilling, between taking a
token and counting the launch) -- against a daemon that reads and writes at
random, late moments. An honest job is never proven to overrun, whatever the
schedule; a job that rewrites its tokens is, at the next read."""

from __future__ import annotations

import random

import pytest

from vgpuctl.core.job import DeviceUsage
from vgpuctl.core.trust import (
    TOKEN_SCALE,
    Gate,
    LaunchLedger,
    check_counters,
)

G = 1 << 30


class Bucket:
    """launch.c's bucket: tokens and last_refill in the job's usage region."""

    def __init__(self) -> None:
        self.tokens = 0
        self.last = 0.0
        self.launches = 0      # usage.dev.launches: gated launches counted

    def refill(self, rate: int, cap: int, now: float) -> None:
        if now <= self.last or rate == 0:
            return
        t = int((now - self.last) * rate)
        if t >= cap:
            add, nxt = cap, now
        else:
            add = t
            if add == 0:
                return
            nxt = self.last + add / rate
        self.last = nxt
        self.tokens = min(cap, self.tokens + add) if self.tokens + add > cap else \
            self.tokens + add

    def take(self, gate: Gate, now: float) -> bool:
        cap = gate.cap
        self.refill(gate.refill_rate, cap, now)
        if self.tokens > cap:
            self.tokens = cap
        if self.tokens >= TOKEN_SCALE:
            self.tokens -= TOKEN_SCALE
            return True
        return False


def honest_run(seed: int, threads: int = 4, seconds: float = 3.0) -> list:
    """A job launching as fast as its gate lets it, on a machine where every
    step of the hook and of the daemon may be late; the proven overruns."""
    rng = random.Random(seed)
    bucket = Bucket()
    gate = Gate(True, 2000 * TOKEN_SCALE, 60 * TOKEN_SCALE)      # 2000/s, 60 a bucket
    region = {"gate": gate}                                       # what the hook reads
    ledger = LaunchLedger(gate, at=0.0)
    t = 0.0
    # per thread: (time it runs next, the gate it read, "count" pending)
    state = [[rng.random() * 0.01, None, False] for _ in range(threads)]
    next_read, next_write = 0.1, 0.05
    proven = []
    while t < seconds:
        # whichever acts next: a hook thread, the daemon's read, its write
        i = min(range(threads), key=lambda k: state[k][0])
        t = min(state[i][0], next_read, next_write)
        if t == next_write:
            # set --core, or the controller: a new rate and bucket, written
            # over a stretch the daemon may be descheduled in
            new = Gate(True, rng.choice([200, 800, 2000, 6000]) * TOKEN_SCALE,
                       rng.choice([1, 6, 30, 180]) * TOKEN_SCALE)
            t1 = t + rng.choice([0.0, 0.001, 0.05, 0.4])
            region["gate"] = new          # the hook may see it from t0...
            ledger.wrote(t, t1, new)      # ...the daemon knows it is there by t1
            next_write = t1 + rng.uniform(0.02, 0.3)
            continue
        if t == next_read:
            t1 = t + rng.choice([0.0, 0.0005, 0.02, 0.3])     # a read that is slow
            over = ledger.read(t, t1, bucket.launches)
            if over is not None and over.proven(threads):
                proven.append(over)
            next_read = t1 + rng.uniform(0.05, 0.4)
            continue
        st = state[i]
        if st[2]:                        # count the launch whose token it took
            bucket.launches += 1
            st[2] = False
            st[0] = t + rng.expovariate(1 / 0.0002)
            continue
        if st[1] is None:                # read the gate, maybe stall before using it
            st[1] = region["gate"]
            st[0] = t + (rng.choice([0.0, 0.0, 0.0, 0.2]) if rng.random() < 0.05 else 0.0)
            continue
        if bucket.take(st[1], t):
            st[2] = True
            # preempted between taking the token and counting the launch
            st[0] = t + (rng.uniform(0.0, 0.5) if rng.random() < 0.01 else 0.0)
        else:
            st[0] = t + 0.001            # a nap, then read the gate again
        st[1] = None
    return proven


@pytest.mark.parametrize("seed", range(40))
def test_an_honest_job_is_never_proven_to_overrun_whatever_the_timing(seed):
    assert honest_run(seed) == []


def test_a_job_that_rewrites_its_tokens_is_proven_at_the_next_read():
    gate = Gate(True, 1500 * TOKEN_SCALE, 45 * TOKEN_SCALE)      # 1509/s in the report
    ledger = LaunchLedger(gate, at=0.0)
    assert ledger.read(0.0, 0.0, 0) is None
    # A burner at 20,000 launches a second with its bucket refilled by hand.
    over = ledger.read(0.1, 0.1, 2000)
    assert over is not None and over.proven(threads=8)
    assert "can have let through" in over.describe("GPU-0", 8)


def test_the_bound_counts_every_rate_in_force_and_a_bucket_a_change():
    ledger = LaunchLedger(Gate(True, 1000 * TOKEN_SCALE, 10 * TOKEN_SCALE), at=0.0)
    ledger.wrote(1.0, 1.5, Gate(True, 100 * TOKEN_SCALE, 10 * TOKEN_SCALE))
    # [0.5, 2]: 1000/s until the write is done (1.5), 100/s from its start (1.0):
    # 1000 + 100 launches of refill, and three buckets (level, straddle, change).
    assert ledger.bound(0.5, 2.0) == pytest.approx(1000 * 1.0 + 100 * 1.0 + 3 * 10)


def test_an_open_or_closed_gate_lets_nothing_through_the_count():
    ledger = LaunchLedger(Gate(False, 0, 0), at=0.0)
    assert ledger.bound(0.0, 10.0) == 0
    ledger.read(0.0, 0.0, 5)
    # One a thread may have taken its token before (two threads here).
    over = ledger.read(10.0, 10.0, 5 + 2)
    assert over is None or not over.proven(threads=2)
    over = ledger.read(11.0, 11.0, 5 + 2 + 3)
    assert over is not None and over.proven(threads=2)
    # A job's threads count for its slack only up to a bound: a job can
    # make threads, not launches.
    assert ledger.read(12.0, 12.0, 10 + 300).proven(threads=100_000)


def test_a_counter_that_goes_back_is_proof():
    ledger = LaunchLedger(Gate(True, 10 * TOKEN_SCALE, TOKEN_SCALE), at=0.0)
    ledger.read(0.0, 0.0, 500)
    over = ledger.read(0.1, 0.1, 0)
    assert over is not None and over.proven(threads=1000)
    assert "went back" in over.describe("GPU-0", 1)


def test_counters_the_hook_cannot_write():
    ok = [DeviceUsage(used=G, peak=2 * G)]
    assert check_counters(ok, [16 * G], [4 * G]) is None
    bad = [DeviceUsage(used=G, peak=40 * G)]
    assert "far more than the GPU's" in check_counters(bad, [16 * G], [4 * G])
