"""Turns: how a GPU's time is divided among the jobs on it. Pure: the daemon
(vgpuctl.daemon.gates) hands in the jobs of one GPU and writes what this
returns into each job's limits, and the hooks keep to it on their own
(libvgpu/hook/turns.c). See docs/compute.md, "Turns".

The GPU's time is a cycle (`cycle_ns`, 50 ms by default) that repeats from
an epoch on the monotonic clock, the same for every job on the GPU. Each job
with a share below 100 % gets a **turn**, a span of the cycle of its share's
length, the turns one after another from the cycle's start; in its turn it
launches alone, up to its share of GPU time a cycle as its own hook measures
it, and nothing outside it. The rest of the cycle, and the turns of jobs
seen idle, are **open**: jobs that may borrow (soft ones, jobs without a
share) launch there, with a little in flight at most.

- ``hard``: its turn, nothing more.
- ``soft``: its turn, and the open spans.
- no share (100 %): no turn; the open spans (the whole cycle where no job
  has a share, with no bound on what it keeps in flight).
- class ``high``: no turn of its own: the whole cycle is its turn, and it
  launches when it wants (the lower classes make way,
  vgpuctl.core.classes), a hard share below 100 % being its GPU time a
  cycle.
- class ``low``: a turn after the normal jobs', of what is left.

A job alone on its GPU, without a hard share below 100 %, is not gated at
all (the hook's launch fast path): its GPU time is the device's busy time.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, replace

# region.h VGPU_GATE_*
OPEN = 0
TURNS = 1
CLOSED = 2
# region.h VGPU_MAX_OPEN
MAX_OPEN = 8

CYCLE_NS = 50_000_000
# A turn is at least this long (the cycle grows for small shares, up to
# MAX_CYCLE_NS): a launching thread woken on a loaded host is late by a
# fraction of it, not by all of it.
MIN_TURN_NS = 2_000_000
MAX_CYCLE_NS = 500_000_000
# What a job may keep in flight in an open span: a job whose turn it is
# waits at most about this for the GPU when it comes back.
BORROW_NS = 1_000_000
# Kept out of the turns when they would fill the cycle: what handing the GPU
# from one job to the next costs (a context switch, tens of us) and what a
# turn carried past its end has to be made up in.
GUARD_NS = 50_000           # a turn
GUARD_MIN = 0.01            # of the cycle


@dataclass(frozen=True)
class Share:
    """A job on one GPU, as the turns see it."""
    key: Hashable
    share: int = 100                 # percent, 1..100
    policy: str = "hard"             # "hard" | "soft"
    cls: str = "normal"              # priority class
    idle: bool = False               # launched nothing for a while: its turn is lent
    gpus: int = 1                    # GPUs the job is on (its ranks' turns line up)


@dataclass(frozen=True)
class Turn:
    """What one job on one GPU keeps to (region.h vgpu_dev_limit): gate
    OPEN (no gate), TURNS (the rest applies) or CLOSED."""
    gate: int = OPEN
    epoch_ns: int = 0
    cycle_ns: int = 0
    start_ns: int = 0
    len_ns: int = 0
    credit_ns: int = 0
    borrow: bool = False
    borrow_ns: int = 0
    open: tuple[tuple[int, int], ...] = ()
    # each open span's (signal, device) of the job whose turn ends where it
    # begins ((-1, 0): none): borrowed work waits for its work in flight
    open_prev: tuple[tuple[int, int], ...] = ()
    prev_signal_id: int = -1         # the job whose turn ends where this one begins
    prev_dev: int = 0

    @property
    def share(self) -> float:
        """The GPU time a cycle it is promised, 0..1."""
        return self.credit_ns / self.cycle_ns if self.cycle_ns else 0.0


OPEN_TURN = Turn()
CLOSED_TURN = Turn(gate=CLOSED)


def needs_turns(members: Iterable[Share]) -> bool:
    """Whether a GPU's jobs are gated: a hard share below 100 % (a cap even
    alone), or two jobs or more (each one's GPU time is then its hook's
    measure; a job alone has the device's)."""
    ms = list(members)
    return len(ms) > 1 or any(m.policy == "hard" and m.share < 100 for m in ms)


def cycle_for(members: Iterable[Share], cycle_ns: int = CYCLE_NS) -> int:
    """The cycle for a GPU's jobs: cycle_ns, longer where a share is so small
    that its turn would be shorter than MIN_TURN_NS."""
    small = min((m.share for m in members if m.cls != "high" and m.share < 100), default=100)
    return min(max(cycle_ns, MIN_TURN_NS * 100 // max(small, 1)), MAX_CYCLE_NS)


Signals = Callable[[Hashable], "tuple[int, int] | None"]


def plan(members: Iterable[Share], epoch_ns: int, cycle_ns: int = CYCLE_NS,
         borrow_ns: int = BORROW_NS,
         signal_of: Signals = lambda key: (-1, 0)) -> dict[Hashable, Turn]:
    """Each job's turn on one GPU (signal_of: a job's signal segment and its
    device there, which the job of the next turn waits on)."""
    ms = list(members)
    if not needs_turns(ms):
        return {m.key: OPEN_TURN for m in ms}
    cycle_ns = cycle_for(ms, cycle_ns)
    turned = [m for m in ms if m.cls != "high" and m.share < 100]
    spans = _lay_out(turned, cycle_ns)
    credits = {k: n for k, (_, n) in spans.items()}
    if not any(_borrows(m) for m in ms):
        spans = _stretch(spans, cycle_ns)
    if not turned:
        borrow_ns = cycle_ns        # no turn to make way for: no bound in flight
    gaps, gaps_before = _open_spans(spans, {m.key for m in turned if m.idle}, cycle_ns)
    before_of = _turn_before(spans)
    base = Turn(TURNS, epoch_ns, cycle_ns)
    out: dict[Hashable, Turn] = {}
    for m in ms:
        before = before_of.get(m.key)
        # borrowed work waits for the job before each open span (not for
        # its own work, which runs in its own stream anyway)
        gaps_prev = tuple(_signal(signal_of, k if k != m.key else None) for k in gaps_before)
        out[m.key] = _turn_of(m, base, spans.get(m.key, (0, 0)), credits.get(m.key, 0),
                              borrow_ns, gaps, gaps_prev,
                              _signal(signal_of, before if before != m.key else None))
    return out


def _open_spans(spans: dict[Hashable, tuple[int, int]], idle: set[Hashable], cycle_ns: int
                ) -> tuple[tuple[tuple[int, int], ...], list[Hashable | None]]:
    """The open spans (the cycle less the turns of jobs not idle), and the
    job whose turn each follows."""
    held = {k: span for k, span in spans.items() if span[1] > 0 and k not in idle}
    gaps = _complement(sorted(held.values()), cycle_ns)
    return gaps, [_held_before(held, start, cycle_ns) for start, _ in gaps]


def _turn_before(spans: dict[Hashable, tuple[int, int]]) -> dict[Hashable, Hashable]:
    """The job of the turn before each turn: each turn waits for its work in
    flight, across a gap too (the gap is where a turn carried past its end
    runs), idle or not (a job going idle changes no one else's turn; an idle
    one has nothing in flight to wait for)."""
    order = sorted((s, k) for k, (s, n) in spans.items() if n > 0)
    return {k: order[i - 1][1] for i, (_, k) in enumerate(order) if len(order) > 1}


def _borrows(m: Share) -> bool:
    """Whether a job launches in the open spans (soft, or no share)."""
    return m.cls != "high" and (m.policy == "soft" or m.share >= 100)


def _stretch(spans: dict[Hashable, tuple[int, int]],
             cycle_ns: int) -> dict[Hashable, tuple[int, int]]:
    """Where no job borrows, the part of the cycle no turn holds would sit
    idle: the turns are stretched over it in proportion, their credit (the
    share) unchanged, so that a job whose host feeds the GPU late (a loaded
    host, a training loop's own work on the CPU between its launches) has
    the time to spend its share in its turn."""
    total = sum(n for _, n in spans.values())
    room = cycle_ns - max(GUARD_NS * len(spans), int(GUARD_MIN * cycle_ns))
    if total <= 0 or total >= room:
        return spans
    out, at = {}, 0
    for k, (_, n) in sorted(spans.items(), key=lambda kv: kv[1][0]):
        length = n * room // total
        out[k] = (at, length)
        at += length
    return out


def _signal(signal_of: Signals, key: Hashable | None) -> tuple[int, int]:
    sig = signal_of(key) if key is not None else None
    return sig if sig is not None else (-1, 0)


def _held_before(held: dict[Hashable, tuple[int, int]], at: int,
                 cycle_ns: int) -> Hashable | None:
    """The job whose held turn ends last at or before `at` in the cycle,
    counting back across the cycle's start; None if no turn is held."""
    if not held:
        return None
    return min(held, key=lambda k: (at - held[k][0] - held[k][1]) % cycle_ns)


def _turn_of(m: Share, base: Turn, span: tuple[int, int], credit: int, borrow_ns: int,
             gaps: tuple[tuple[int, int], ...], gaps_prev: tuple[tuple[int, int], ...],
             prev: tuple[int, int]) -> Turn:
    cycle = base.cycle_ns
    if m.cls == "high":
        # the whole cycle is its turn; a hard share bounds its GPU time a
        # cycle, else nothing does (twice the cycle: never reached)
        hard = m.policy == "hard" and m.share < 100
        return replace(base, len_ns=cycle,
                       credit_ns=cycle * m.share // 100 if hard else 2 * cycle)
    if m.policy == "soft" or m.share >= 100:
        return replace(base, start_ns=span[0], len_ns=span[1], credit_ns=span[1], borrow=True,
                       borrow_ns=borrow_ns, open=gaps, open_prev=gaps_prev,
                       prev_signal_id=prev[0],
                       prev_dev=prev[1])
    return replace(base, start_ns=span[0], len_ns=span[1], credit_ns=credit,
                   prev_signal_id=prev[0], prev_dev=prev[1])


def _lay_out(turned: list[Share], cycle_ns: int) -> dict[Hashable, tuple[int, int]]:
    """The turns' spans (start, length), one after another from the cycle's
    start: normal before low; jobs on several GPUs first, so that where the
    same jobs share the same GPUs their ranks' turns begin together on each
    (a collective's ranks wait for each other); else the order they came.
    The normal jobs' turns (promises) are scaled to the room only if they
    overfill it; the low jobs' share what is left of it."""
    order = sorted(turned, key=lambda m: (m.cls == "low", m.gpus == 1))
    room = cycle_ns - max(GUARD_NS * len(order), int(GUARD_MIN * cycle_ns))
    spans: dict[Hashable, tuple[int, int]] = {}
    at = 0
    for low in (False, True):
        cls = [m for m in order if (m.cls == "low") == low]
        asked = sum(cycle_ns * m.share // 100 for m in cls)
        left = max(room - at, 0)
        for m in cls:
            length = cycle_ns * m.share // 100
            if asked > left:
                length = length * left // asked
            spans[m.key] = (at, length)
            at += length
    return spans


def _complement(held: list[tuple[int, int]], cycle_ns: int) -> tuple[tuple[int, int], ...]:
    """The spans of [0, cycle) outside the held ones (sorted, apart), at
    most MAX_OPEN of them: the longest kept."""
    gaps = []
    at = 0
    for start, length in held:
        if start > at:
            gaps.append((at, start - at))
        at = max(at, start + length)
    if at < cycle_ns:
        gaps.append((at, cycle_ns - at))
    if len(gaps) > MAX_OPEN:
        gaps = sorted(sorted(gaps, key=lambda g: -g[1])[:MAX_OPEN])
    return tuple(gaps)
