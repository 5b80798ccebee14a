"""Turns in a job's region (region.h): the turn fields of its limits,
written here. The hook reads them as a whole between two reads of
turn_gen, which is odd while they are rewritten (a seqlock), so a hook never
keeps to a turn half written."""

from __future__ import annotations

from vgpuctl.core.turns import MAX_OPEN, Turn
from vgpuctl.system.region import Region


def write_turn(region: Region, i: int, t: Turn) -> None:
    """Write device i's gate and turn; the generation is bumped as a whole."""
    dev = region.limits.dev[i]
    if read_turn(region, i) == t:
        return
    dev.turn_gen += 1 if dev.turn_gen % 2 == 0 else 2
    dev.epoch_ns = t.epoch_ns
    dev.cycle_ns = t.cycle_ns
    dev.turn_start_ns = t.start_ns
    dev.turn_len_ns = t.len_ns
    dev.turn_credit_ns = t.credit_ns
    dev.borrow = 1 if t.borrow else 0
    dev.borrow_ns = t.borrow_ns
    spans = t.open[:MAX_OPEN]
    for k in range(MAX_OPEN):
        start, length = spans[k] if k < len(spans) else (0, 0)
        sig, sdev = t.open_prev[k] if k < len(spans) and k < len(t.open_prev) else (-1, 0)
        dev.open[k].start_ns = start
        dev.open[k].len_ns = length
        dev.open[k].prev_signal_id = sig
        dev.open[k].prev_dev = sdev
    dev.nopen = len(spans)
    dev.prev_signal_id = t.prev_signal_id
    dev.prev_dev = t.prev_dev
    dev.turn_gen += 1
    dev.throttle = t.gate
    region.limits.generation += 1


def read_turn(region: Region, i: int) -> Turn:
    dev = region.limits.dev[i]
    n = min(int(dev.nopen), MAX_OPEN)
    return Turn(gate=int(dev.throttle), epoch_ns=int(dev.epoch_ns), cycle_ns=int(dev.cycle_ns),
                start_ns=int(dev.turn_start_ns), len_ns=int(dev.turn_len_ns),
                credit_ns=int(dev.turn_credit_ns), borrow=bool(dev.borrow),
                borrow_ns=int(dev.borrow_ns),
                open=tuple((int(dev.open[k].start_ns), int(dev.open[k].len_ns))
                           for k in range(n)),
                open_prev=tuple((int(dev.open[k].prev_signal_id), int(dev.open[k].prev_dev))
                                for k in range(n)),
                prev_signal_id=int(dev.prev_signal_id), prev_dev=int(dev.prev_dev))
