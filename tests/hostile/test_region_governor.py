"""A job's user writes the launch and GPU-time counters of its own usage
region as it likes (2^64-1, back to 0, again, or a GPU time far beyond any
wall time), against the daemon's compute step driven tick by tick (the
supervisor of tests/daemon/test_supervisor.py over real regions, its gates
on a fake clock, the accountant fed as the daemon's tick feeds it). Every
turn still fits the region's fields, no gate widens, the neighbours' turns,
measured shares and bills are unmoved, the liar is billed no more than its
wall time, and a counter that went back flags it with its gate closed.
Ticks are steps, never sleeps."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from support.daemon import ask

from vgpuctl.core import protocol as P
from vgpuctl.core import turns
from vgpuctl.core.accounting import BUSY_SLACK_S, Accountant
from vgpuctl.core.config import Config
from vgpuctl.daemon.gates import Gates
from vgpuctl.daemon.supervisor import Peer, Supervisor
from vgpuctl.store.database import Store
from vgpuctl.system.nvml import GpuStats
from vgpuctl.system.paths import DaemonPaths
from vgpuctl.system.region import Region
from vgpuctl.system.structs import ffi
from vgpuctl.system.turn_fields import read_turn
from vgpuctl.system.usage import MAX_COUNT

G = 1 << 30
U64_MAX = 2**64 - 1
GPU = GpuStats(0, "GPU-00000000-aaaa", "Sim GPU", 16 * G)
ME = Peer(os.getpid(), os.getuid(), os.getgid())
TICK = 0.1


class Node:
    """A daemon's core over one GPU, ticked by hand."""

    def __init__(self, tmp_path: Path) -> None:
        dp = DaemonPaths(socket=tmp_path / "s.sock", runtime_dir=tmp_path / "run",
                         state_dir=tmp_path / "state", config=None, system=False)
        dp.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.store = Store.open(dp.db)
        self.sup = Supervisor(Config(), dp, self.store, [GPU],
                              hook_library=lambda: tmp_path / "libvgpu.so")
        self.now = 5000.0
        self.sup.gates = Gates(self.sup.table, self.sup.trust, clock=lambda: self.now)
        self.acc = Accountant()
        self.first: dict[str, float] = {}

    def run(self, **fields) -> tuple[str, Region]:
        reply = ask(self.sup, ME, P.encode_request(
            "run", command=["sleep", "60"], cwd="/", mem=G, **fields))
        exc = P.reply_exception(reply)
        if exc is not None:
            raise exc
        return reply["job"]["id"], Region.open(reply["env"]["VGPU_REGION"],
                                               writable_usage=True)

    def tick(self) -> None:
        """What the daemon's tick does of the compute: read every job's
        counters, plan and write the turns, bill each job's GPU time."""
        self.now += TICK
        gates = self.sup.gates
        inputs = gates.inputs()
        gates.step(inputs)
        for i in inputs:
            on = i.on
            self.first.setdefault(on.job_id, self.now)
            self.acc.observe(on.job_id, on.uuid, self.now, gates.measured(on.job_id, on.uuid), 0,
                             busy_s=gates.busy_s(on.job_id, on.uuid))

    def close(self) -> None:
        self.sup.close()
        self.store.close()


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path)
    yield n
    n.close()


def poke(reg: Region, field: str, value: int) -> None:
    """Write device 0's job-wide counter, as the job's user can."""
    f = ffi()
    off = f.offsetof("struct vgpu_usage", "dev") + f.offsetof("struct vgpu_dev_usage", field)
    reg.poke_usage(off, value.to_bytes(8, sys.byteorder))


class Honest:
    """A job's hook keeping to its turns: its GPU time grows at its share."""

    def __init__(self, reg: Region, share: float) -> None:
        self.reg, self.share = reg, share
        self.busy = self.launches = 0

    def run(self) -> None:
        self.busy += int(self.share * TICK * 1e9)
        self.launches += 25
        poke(self.reg, "busy_ns", self.busy)
        poke(self.reg, "launches", self.launches)


def fits(t: turns.Turn) -> bool:
    """A turn the region's fields hold, and the hook can keep to."""
    values = [t.epoch_ns, t.cycle_ns, t.start_ns, t.len_ns, t.credit_ns, t.borrow_ns]
    values += [v for span in t.open for v in span]
    if not all(0 <= v < 2**63 for v in values) or t.gate not in (turns.OPEN, turns.TURNS,
                                                                  turns.CLOSED):
        return False
    if t.gate != turns.TURNS:
        return True
    return (t.start_ns + t.len_ns <= t.cycle_ns and t.credit_ns <= t.cycle_ns
            and all(s + n <= t.cycle_ns for s, n in t.open))


def spans(t: turns.Turn) -> tuple:
    """What a turn lets its job launch: its gate, its turn, what it borrows
    (whom it waits for at its start aside)."""
    return (t.gate, t.epoch_ns, t.cycle_ns, t.start_ns, t.len_ns, t.credit_ns, t.borrow,
            t.borrow_ns, t.open)


def no_wider(now: turns.Turn, before: turns.Turn) -> bool:
    """The attacker's gate after the attack: as it was, or closed."""
    return spans(now) == spans(before) or now.gate == turns.CLOSED


def covers(spans, start: int, length: int) -> bool:
    return any(s < start + length and start < s + n for s, n in spans)


@pytest.mark.parametrize("field", ["launches", "busy_ns"])
def test_a_counter_at_2_64_minus_1_and_back_widens_no_gate(node, field):
    attacker, areg = node.run(core=20, policy="hard")
    victim, vreg = node.run(core=30, policy="hard")
    borrower, breg = node.run()
    honest = [Honest(areg, 0.2), Honest(vreg, 0.3), Honest(breg, 0.4)]
    for _ in range(20):
        for h in honest:
            h.run()
        node.tick()
    a0, v0, b0 = read_turn(areg, 0), read_turn(vreg, 0), read_turn(breg, 0)
    assert a0.gate == v0.gate == b0.gate == turns.TURNS
    assert not covers(b0.open, v0.start_ns, v0.len_ns)
    victim_billed = node.acc.gpu_seconds(victim, GPU.uuid)
    t_attack = node.now
    for k in range(40):
        honest[1].run()
        honest[2].run()
        poke(areg, field, U64_MAX if k % 2 == 0 else 0)
        node.tick()
        for reg in (areg, vreg, breg):
            assert fits(read_turn(reg, 0)), read_turn(reg, 0)
        assert no_wider(read_turn(areg, 0), a0)
        assert spans(read_turn(vreg, 0)) == spans(v0)      # the neighbour's turn, unmoved
        assert read_turn(breg, 0).borrow_ns == b0.borrow_ns
        # a borrower gets the attacker's turn at most (once it is idle), never
        # the neighbour's
        assert not covers(read_turn(breg, 0).open, v0.start_ns, v0.len_ns)
    # The counter going back is proof: the attacker is flagged, its gate closed.
    why = node.sup.table.get(attacker).rec.region_error
    assert why is not None and "went back" in why
    assert read_turn(areg, 0) == turns.CLOSED_TURN
    assert node.sup.table.get(victim).rec.region_error is None
    # The neighbour's measured share and its bill over the attack are its own.
    assert node.sup.gates.measured(victim, GPU.uuid) == pytest.approx(0.30, abs=0.01)
    billed = node.acc.gpu_seconds(victim, GPU.uuid) - victim_billed
    assert billed == pytest.approx(0.30 * (node.now - t_attack), rel=0.02)
    # The attacker's bill holds no more than its wall time (and the slack).
    assert node.acc.gpu_seconds(attacker, GPU.uuid) <= (
        node.now - node.first[attacker]) + BUSY_SLACK_S + 1e-6


def test_a_huge_gpu_time_bills_the_liar_no_more_than_its_wall_time(node):
    """A job that writes a GPU time far beyond any wall time, and keeps it
    growing (no proof: the hook only adds), lies to its own bill and its own
    view: it is billed no more than its wall time, and its neighbour's turn,
    measured share and bill are what they were."""
    liar, lreg = node.run(core=20, policy="hard")
    victim, vreg = node.run(core=30, policy="hard")
    honest = Honest(vreg, 0.3)
    lies = Honest(lreg, 0.2)
    for _ in range(10):
        honest.run()
        lies.run()
        node.tick()
    v0, l0 = read_turn(vreg, 0), read_turn(lreg, 0)
    victim_billed = node.acc.gpu_seconds(victim, GPU.uuid)
    t_attack = node.now
    for k in range(50):
        honest.run()
        lies.busy = min(MAX_COUNT - 1, 2**50 + k * 2**44)    # days of GPU time a tick
        lies.launches += 1
        poke(lreg, "busy_ns", lies.busy)
        poke(lreg, "launches", lies.launches)
        node.tick()
        assert spans(read_turn(vreg, 0)) == spans(v0)
        assert spans(read_turn(lreg, 0)) == spans(l0)         # its own turn: no wider
        assert node.sup.gates.measured(victim, GPU.uuid) == pytest.approx(0.30, abs=0.01)
    wall = node.now - node.first[liar]
    assert node.acc.gpu_seconds(liar, GPU.uuid) <= wall + BUSY_SLACK_S + 1e-6
    billed = node.acc.gpu_seconds(victim, GPU.uuid) - victim_billed
    assert billed == pytest.approx(0.30 * (node.now - t_attack), rel=0.02)
