"""What counts as tampering with a job's usage region, and how sure the daemon
must be before it acts. Pure: the daemon (vgpuctl.daemon.trust) reads the
region, the clock and /proc, and hands the figures in.

The usage region is the job's own file: the hook writes its counters there,
and so can anything else the job's user runs. The daemon flags a job, ignores
its counters from then on and closes its compute gate for good (its kernel
launches fail) only on *proof*: something the hook can never have written,
whatever the machine's load did to either side's timing. There are two kinds:

- **an impossible value** (`check_counters`, and the format checks of
  vgpuctl.system.region: a header that is not the region's, a byte counter
  beyond any GPU): no hook writes it, on any schedule.
- **more launches than the gate can have let through** (`LaunchLedger`): the
  hook's token bucket refills at the rate the daemon wrote, up to the bucket
  size it wrote, and every gated launch takes one launch's tokens. From the
  daemon's own record of what it wrote and when (its monotonic clock read
  before and after each write, the clock the hook refills by), the ledger
  bounds the gated launches between two reads of the counter from above,
  assuming nothing of how promptly either side ran: each read counts from
  the earliest instant it may have been taken to the latest, every rate that
  may have been in force at an instant counts at its highest, and each change
  of the gate adds a whole bucket (the hook refills lazily: a refill after a
  change may apply the new rate, or a stale one, to time before it). A count
  past that bound, by more than the launches the job's threads can hold in
  flight between taking a token and counting it (one a thread, for at most
  MAX_THREADS threads), is proof.

Nothing else closes a gate. What the daemon sees through NVML (a job over
its share for a while, over its memory) is a violation, not tampering:
vgpuctl.core.violations, reported or acted on as `on_violation` says. A
verdict on timing alone (launches a little over what a tick "should" allow)
is never proof: the daemon's and the job's threads are scheduled by a
loaded machine, and an honest job must never be punished for that.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from vgpuctl.core.job import DeviceUsage

# A launch's tokens in the hook's bucket (region.h VGPU_TOKEN_SCALE).
TOKEN_SCALE = 1000
# Launches one thread of the job can have counted without a token of the
# window being read: one whose token it took before the window, counted in
# it (launch.c counts a launch right after taking its token).
PER_THREAD = 1
# ...counted for at most this many threads: a job's threads are its own to
# multiply, and more than this many caught between the two instructions at
# once does not happen.
MAX_THREADS = 256
# Gate writes kept: enough to span any gap between two reads.
MAX_WRITES = 4096


@dataclass(frozen=True)
class Gate:
    """What the daemon wrote into a device's limits: the hook's gate."""
    throttle: bool
    refill_rate: int        # tokens per second
    bucket_size: int        # tokens

    @property
    def cap(self) -> int:
        """Tokens the hook's bucket holds at most under this gate (launch.c:
        never less than one launch)."""
        return max(self.bucket_size, TOKEN_SCALE)

    @property
    def counts(self) -> bool:
        """Whether launches through this gate are counted in the device's
        `launches` (only gated launches are)."""
        return self.throttle and not (self.refill_rate == 0 and self.bucket_size == 0)


OPEN = Gate(False, 0, 0)
CLOSED = Gate(True, 0, 0)


@dataclass(frozen=True)
class _Write:
    t0: float       # the clock before the write
    t1: float       # ...and after it
    gate: Gate


@dataclass(frozen=True)
class Overrun:
    """A read of the gated-launch counter the hook can't have made: more
    launches than the ledger's bound (before the threads' slack), or fewer
    than at the previous read (the hook only ever adds)."""
    launched: int       # since the previous read (negative: it went back)
    bound: float        # launches
    t0: float
    t1: float

    def slack(self, threads: int) -> float:
        return self.bound + PER_THREAD * min(max(1, threads), MAX_THREADS)

    def proven(self, threads: int) -> bool:
        return self.launched < 0 or self.launched > self.slack(threads)

    def describe(self, uuid: str, threads: int) -> str:
        if self.launched < 0:
            return f"its gated-launch counter on {uuid} went back by {-self.launched}"
        return (f"{self.launched} gated launches on {uuid} in {self.t1 - self.t0:.2f} s, "
                f"more than the {self.slack(threads):.0f} its gate can have let through")


class LaunchLedger:
    """The gate's history on one GPU of one job, and the bound it puts on the
    hook's gated-launch counter between two reads (see the module's doc).
    Times are the daemon's CLOCK_MONOTONIC, in seconds."""

    def __init__(self, initial: Gate = OPEN, at: float = 0.0) -> None:
        self._writes: deque[_Write] = deque(maxlen=MAX_WRITES)
        self._writes.append(_Write(at, at, initial))
        self._last: tuple[float, int] | None = None   # (earliest instant, count) of the last read

    @property
    def gate(self) -> Gate:
        return self._writes[-1].gate

    def wrote(self, t0: float, t1: float, gate: Gate) -> None:
        """The daemon wrote ``gate`` between t0 and t1."""
        if gate != self.gate:
            self._writes.append(_Write(t0, max(t0, t1), gate))

    def read(self, t0: float, t1: float, launches: int) -> Overrun | None:
        """The counter read ``launches`` between t0 and t1: an Overrun when
        the launches since the previous read are more than the gate can have
        let through, or fewer than before (None: within the bound, or the
        first read)."""
        last, self._last = self._last, (t0, launches)
        if last is None:
            return None
        since, before = last
        n = launches - before
        bound = self.bound(since, t1)
        if 0 <= n <= bound:
            return None
        return Overrun(n, bound, since, t1)

    def bound(self, a: float, b: float) -> float:
        """The most gated launches the hook can have counted in [a, b]."""
        if b < a:
            a, b = b, a
        # The writes in force at some instant of [a, b]: from the last one
        # done before a (its t1 <= a) on, each in force from its t0 until the
        # next one's t1.
        ws = list(self._writes)
        first = 0
        for i, w in enumerate(ws):
            if w.t1 <= a:
                first = i
        live = ws[first:]
        live = [w for w in live if w.t0 <= b] or [ws[first]]
        cap = max(w.gate.cap for w in live if w.gate.counts) if any(
            w.gate.counts for w in live) else 0
        tokens = 0.0
        for k, w in enumerate(live):
            if not w.gate.counts:
                continue
            start = max(a, w.t0)
            end = min(b, live[k + 1].t1) if k + 1 < len(live) else b
            if end > start:
                tokens += w.gate.refill_rate * (end - start)
        changes = len(live) - 1
        tokens += cap * (2 + changes)      # the bucket's level at a, a refill
        return tokens / TOKEN_SCALE        # straddling a, and one per change


def check_counters(devs: list[DeviceUsage], totals: list[int],
                   limits: list[int]) -> str | None:
    """Why the hook can't have written these device counters (None: it
    can have). totals: each GPU's memory; limits: the job's limit on each.
    The hook never counts more than it reserved, and it reserves no more
    than the driver gave it: a peak beyond twice the larger of the GPU and
    the limit (a limit may be set below what is held) is no reading."""
    for i, d in enumerate(devs):
        total = totals[i] if i < len(totals) else 0
        limit = limits[i] if i < len(limits) else 0
        if d.peak > 2 * max(total, limit):
            return f"peak = {d.peak} bytes, far more than the GPU's {total}"
    return None
