"""The governor fed the launch counters a job's user writes into its region
(2^64-1, back to 0, again): every gate still fits the region's fields and
the other jobs' gates are unmoved. Ticks are steps over the fluid model of
tests/unit/test_governor.py, never sleeps."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from test_governor import Job, World, governor, run  # noqa: E402

from vgpuctl.core import trust  # noqa: E402
from vgpuctl.core.trust import LaunchLedger  # noqa: E402
from vgpuctl.system.region import MAX_COUNT  # noqa: E402

U64_MAX = 2**64 - 1


def test_a_counter_at_2_64_minus_1_widens_no_gate_and_is_caught() -> None:
    attacker, victim = Job("a", 1, 20), Job("b", 2, 10)
    world = World([attacker, victim])
    gov = governor(world)
    run(world, gov, 40)
    for k in range(40):
        attacker.launches = U64_MAX if k % 2 == 0 else 0
        gates = run(world, gov, 1)
        for g in gates.values():
            # what the region's uint64 fields can hold (was 3e21: every
            # tick failed writing it, and no gate was written after it)
            assert 0 <= g.refill_rate < 2**63 and 0 <= g.bucket_size < 2**63
    victim_gate = gates[("b", "GPU-0")]
    assert victim_gate.throttle
    held = sum(victim.got[-20:]) / 20
    assert abs(held - 0.10) < 0.02, held          # still held at its 10 %
    # Region trust flags the attacker: its counter jumped by 2^53 (the
    # reader saturates there), then went back; each is proof on its own.
    ledger = LaunchLedger(trust.Gate(True, 20_000, 1_000), at=0.0)
    assert ledger.read(0.0, 0.0, 1000) is None
    assert ledger.read(0.1, 0.1, MAX_COUNT).proven(threads=64)
    assert ledger.read(0.2, 0.2, 0).proven(threads=64)
