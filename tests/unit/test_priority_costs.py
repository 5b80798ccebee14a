"""The launch costs the priority classes price work in flight by
(vgpuctl.daemon.priority.Priorities.observe), where NVML names one process a
sample period: an H100 gives each 200 ms period to one process, with the
whole device's utilization, so a job on the GPU a fifth of the time is named
in about a fifth of the periods and its busy time per launch is right only
on average over many of them."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from vgpuctl.daemon import priority as DP
from vgpuctl.system.priority import ClassFields

UUID = "GPU-0"
COST = 1e-3                     # both jobs' kernels: 1 ms
PERIOD = 0.2


def _job(job_id: str, pid: int) -> SimpleNamespace:
    rec = SimpleNamespace(region_error=None, pids=[pid], launcher_pid=None, suspended=False)
    return SimpleNamespace(id=job_id, region=SimpleNamespace(signal_id=int(job_id)), rec=rec,
                           uuids=lambda: [UUID])


def _run(seed: int, per_process, seconds: float = 60.0, monkeypatch=None) -> list[float]:
    """A high client on the GPU 20 % of the time (about 20 launches a 100 ms
    tick) beside a low trainer that fills the rest; each 200 ms period names
    the client with chance 0.2, else the trainer. The client's cost as the
    daemon reads it over the last 20 s, in units of the truth."""
    rnd = random.Random(seed)
    client, trainer = _job("1", 101), _job("2", 102)
    p = DP.Priorities([client, trainer], lambda: None)      # type: ignore[arg-type]
    p._written[("1", 0)] = ClassFields(hold=2)
    p._written[("2", 0)] = ClassFields(hold=1)
    counts = {"1": 0, "2": 0}
    monkeypatch.setattr(DP, "signal_launches", lambda region, n: [counts[str(region.signal_id)]])
    out, t, k = [], 0.0, 0
    while t < seconds:
        n = max(0, round(rnd.gauss(20, 4)))
        counts["1"] += n
        counts["2"] += 100 - n
        t += 0.1
        k += 1
        windows = {}
        if k % 2 == 0:
            named = 101 if rnd.random() < 0.2 else 102
            windows[UUID] = SimpleNamespace(start_s=t - PERIOD, end_s=t, duration_s=PERIOD,
                                            coarse=False, busy_s={named: 0.99 * PERIOD})
        p.observe(windows, t, per_process)
        v = p.cost("1", UUID)
        if t > seconds - 20 and v is not None:
            out.append(v / COST)
    return out


def test_a_cost_is_averaged_long_where_nvml_names_one_process(monkeypatch):
    near = far = total = 0
    for seed in range(20):
        vals = _run(seed, lambda uuid: False, monkeypatch=monkeypatch)
        total += len(vals)
        near += sum(1 for v in vals if 0.65 <= v <= 1.35)
        far += sum(1 for v in vals if v < 0.4 or v > 2.0)
    # (averaged over 0.4 s, the half-life where NVML splits per process and
    # everywhere before: 26 % within ±35 %, 41 % below 0.4 or above 2)
    assert near / total >= 0.9
    assert far == 0


def test_where_nvml_splits_per_process_a_cost_follows_a_change_quickly(monkeypatch):
    monkeypatch.setattr(DP, "signal_launches", lambda region, n: [counts[0]])
    job = _job("1", 101)
    p = DP.Priorities([job], lambda: None)                  # type: ignore[arg-type]
    p._written[("1", 0)] = ClassFields(hold=2)
    counts, t = [0], 0.0
    for cost in (1e-3, 0.5e-3):
        for _ in range(20):                                 # 2 s of each
            counts[0] += 100
            t += 0.1
            w = SimpleNamespace(start_s=t - 0.1, end_s=t, duration_s=0.1, coarse=False,
                                busy_s={101: 100 * cost})
            p.observe({UUID: w}, t, lambda uuid: True)
        assert p.cost("1", UUID) == pytest.approx(cost, rel=0.05)
