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
