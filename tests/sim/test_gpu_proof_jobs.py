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


def test_the_probe_step_recovers_the_simulators_time_slice_and_switch(sim_env, tmp_path):
    """bench/gpu/probe.py on the simulated GPU, with a slice and a switch
    other than the defaults: two and three processes' events give back
    VGPU_SIM_TIMESLICE_US and VGPU_SIM_SWITCH_US; a copying neighbour takes
    no turns (copies take no device time here); a spin of 1 ms spans about
    1 ms alone and more next to a saturating process; CUPTI is not there."""
    pytest.importorskip("cuda.bindings.driver")
    env = dict(sim_env, VGPU_SIM="1x16G", VGPU_SIM_TIMESLICE_US="1000", VGPU_SIM_SWITCH_US="50")
    out = subprocess.run([sys.executable, str(GPU_BENCH / "probe.py"), "--out", str(tmp_path),
                          "--seconds", "0.8", "--reps", "4", "--copy-mib", "16"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    res = json.loads((tmp_path / "probe.json").read_text())
    checks = {c["name"]: c for c in res["checks"]}
    assert {n: c["status"] for n, c in checks.items()} == {
        "solo": "pass", "pair": "pass", "trio": "pass", "spans": "pass", "copy": "pass",
        "cupti": "skipped"}, checks
    f = res["figures"]
    assert f["sim_settings"] == {"timeslice_us": 1000.0, "switch_us": 50.0}
    # A host stalled past the 25.6 ms it keeps queued drains its queue: a
    # gap, after which its kernels no longer start on the slices' grid and a
    # turn's end from events lands up to a kernel early; the processes'
    # clocks are tied to the host's within some us. A single gap can be off
    # by either; the slice, the switch from the time off and the mean of the
    # hand-over directions are not.
    assert f["solo"]["per_proc"][0]["turns"] <= 3
    for case in ("pair", "trio"):
        t = f[case]
        assert t["source"] == "events (host-aligned)"
        assert t["slice_us"]["p50"] == pytest.approx(1000, abs=20), t["slice_us"]
        assert t["switch_us_from_off"] == pytest.approx(50, abs=5), t
        assert t["switch_us"] == pytest.approx(50, abs=10), t["handover_by_direction_us"]
    assert f["copy"]["kernel_rate_vs_solo"] == pytest.approx(1.0, abs=0.05)
    spin = f["spans"]["kinds"]["spin1ms"]
    assert spin["alone"]["span_ms"]["p50"] == pytest.approx(1.0, abs=0.3)
    assert spin["contended"]["span_ms"]["p50"] > spin["alone"]["span_ms"]["p50"]


def test_the_probes_globaltimer_timeline_gives_slice_and_switch():
    """What a real GPU's stamps would say (made up here: the simulator's
    kernels write nothing): two processes take turns of 2000 us with 25 us
    idle between, their 100 us spin kernels preempted part-way at a turn's
    end (a %globaltimer spin then ends as soon as it resumes)."""
    sys.path.insert(0, str(GPU_BENCH))
    import probe

    S, W, L, G = 2000_000, 25_000, 100_000, 1_000     # ns: slice, switch, kernel, launch gap
    t0 = 1_700_000_000_000_000_000
    stamps: list[list[list[int]]] = [[], []]
    pending: list[list[int] | None] = [None, None]      # a kernel preempted part-way
    t = t0
    for turn in range(40):
        p = turn % 2
        end_turn = t + S
        cur = t + (37_000 if turn == 0 else 0)          # kernels straddle the turns' ends
        if pending[p] is not None:              # resumes: its time has passed, it ends
            s, at = pending[p]
            stamps[p].append([s, cur + 500, cur - at, at])
            cur += 500 + G
            pending[p] = None
        while cur + L <= end_turn:
            stamps[p].append([cur, cur + L, 200, cur])
            cur += L + G
        if cur < end_turn:
            pending[p] = [cur, end_turn]
        t = end_turn + W
    results = []
    for p in range(2):
        ends = [(st[1] - stamps[p][0][0]) / 1e3 for st in stamps[p]]
        results.append({"kernel_us": 100.0, "stamped": True, "stamps": stamps[p],
                        "ends_us": ends, "base_host_ns": 0, "anchor_spread_ns": 0,
                        "rate": None, "kernels": len(ends)})
    tl = probe.spin_timeline(results, 10)
    assert tl["source"] == "globaltimer"
    assert tl["slice_us"]["p50"] == pytest.approx(2000, abs=1)
    assert tl["handover_us"]["p50"] == pytest.approx(25, abs=1)
    assert tl["switch_us"] == pytest.approx(25, abs=1)
    assert tl["switch_us_from_off"] == pytest.approx(25, abs=1)
    assert tl["overlaps"] == 0
    assert tl["events_view"]["slice_us"]["p50"] == pytest.approx(2000, abs=L / 1e3)
