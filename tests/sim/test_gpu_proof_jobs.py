"""The real-GPU proof's job programs (bench/gpu/job_*.py), run on the
simulated GPU: what they report of themselves must be what they ran, or a
real GPU's figures are judged against the wrong yardstick."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.daemon import needs_native

pytestmark = needs_native

GPU_BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu"


def test_a_duty_run_that_stops_inside_a_cycle_reports_its_duty(sim_env):
    """Three 400 ms cycles at 30 % (120 ms of kernels each) in a run of
    1.0 s, which ends inside the third cycle's idle part: the process was
    busy 30 % of its cycles, and says so (it said 36 % on an H100, dividing
    by the 1.0 s)."""
    out = subprocess.run([sys.executable, str(GPU_BENCH / "job_duty.py"), "--duty", "30",
                          "--cycle-ms", "400", "--kernel-ms", "10", "--seconds", "1.0"],
                         env=sim_env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["cycles"] >= 2
    assert all(b[2] == pytest.approx(120, abs=5) for b in res["bursts"]), res["bursts"]
    assert res["busy_pct"] == pytest.approx(30, abs=2)


def test_the_probes_reader_keeps_its_first_last_seen_until_it_gets_an_entry(monkeypatch):
    """A stream's first read asks for the window before it; until a read
    returns an entry, later reads ask from that same time: a 0.1 s reader
    whose reads each come just before the next period is published (the
    simulator publishes 25 ms after a period) still sees every period. It
    asked from `now - 0.1 s` at every read, and saw none (solo60 on the
    simulator)."""
    import sys as _sys
    _sys.path.insert(0, str(GPU_BENCH))
    import nvml_probe

    class NotFound(Exception):
        value = 6

    class FakeNvml:
        class nv:
            NVMLError = NotFound
            NVML_ERROR_FUNCTION_NOT_FOUND = 13

        asked: list[int] = []

        def process_utilization(self, last_seen: int):
            self.asked.append(last_seen)
            if len(self.asked) < 3:
                raise NotFound()
            return {"rc": "SUCCESS", "count": 1, "entries": [[1, last_seen + 5, 30, 0, 0, 0]]}

        def rc(self, code: int) -> str:
            return "NOT_FOUND"

    clock = iter([100.0, 100.1, 100.2, 100.3])
    monkeypatch.setattr(nvml_probe.time, "time", lambda: next(clock))
    fake = FakeNvml()
    s = nvml_probe.Stream("pu@0.1", "pu", 0.1, 1, nvml_probe.EntryBudget())
    for _ in range(4):
        s.read(fake)
    first = int(99.9 * 1e6)
    assert fake.asked == [first, first, first, first + 5]
