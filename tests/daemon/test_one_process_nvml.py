"""A driver that names one process per sample period (an H100 with driver
580, the simulator's default `VGPU_SIM_UTIL_PROCS=last`, and `busiest`, the
same with the busiest process named): NVML's entries give one job the whole
GPU's busy time and its neighbour none. Honest hooked jobs must still be
measured at their shares (what `ps` shows), billed what they ran, and never
taken for a bypass; a real bypass must still be caught."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.daemon import kill_and_reap, needs_native, vgpuctl_argv, wait_for
from support.store import usage_rows

from vgpuctl.system import native

pytestmark = needs_native

KILL = 'on_violation = "kill"\n'
SHARES = {"j30": 30, "j60": 60}


def _daemon(daemon_factory, mode: str):
    d = daemon_factory(gpus="1x16G", config=KILL, start=False)
    d.env["VGPU_SIM_UTIL_PROCS"] = mode
    return d.start()


def _cpu_load() -> list[subprocess.Popen]:
    """A loaded node: a spinning process per core, so that the daemon and the
    jobs' threads are late as they are on a busy machine."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 2)]


def _busy_by_tag(d) -> dict[str, float]:
    r = subprocess.run([*vgpuctl_argv(), "sim", "stats", "--json"], env=d.env,
                       capture_output=True, text=True, timeout=60, check=True)
    return {t["name"]: t["devices"][0]["busy_ns"] / 1e9 for t in json.loads(r.stdout)["tags"]}


def _all_violations(d) -> list[dict]:
    ps = d.call("ps", all=True)
    return [v for j in ps["jobs"] for v in j["violations"]] + list(ps["violations"])


@pytest.mark.parametrize("mode", ["last", "busiest"])
def test_two_honest_jobs_are_measured_billed_and_never_ended(daemon_factory, mode):
    d = _daemon(daemon_factory, mode)
    burn = str(native.burn_program())
    load = _cpu_load()
    procs = {}
    shown: dict[str, float] = {}
    try:
        procs = {tag: d.popen("run", "--mem", "1G", "--core", str(core), "--policy", "hard",
                              "--name", tag, "--", burn, "--kernel-us", "1000", "--seconds",
                              "14", env={"VGPU_SIM_TAG": tag})
                 for tag, core in SHARES.items()}

        def settled() -> bool:
            rows = {j["name"]: j for j in d.jobs()}
            shown.update({t: rows[t].get("core_measured") or 0.0 for t in SHARES if t in rows})
            return len(shown) == 2 and all(abs(shown[t] - c / 100) <= 0.06
                                           for t, c in SHARES.items())
        try:
            wait_for(settled, timeout=12, what="ps to show each job at its share")
        except AssertionError:
            pass                                # judged below, with the rest
        exits = {tag: p.wait(60) for tag, p in procs.items()}
    finally:
        for p in load:
            p.kill()
        for p in load:
            p.wait()
        for p in procs.values():
            kill_and_reap(p)
    ran = _busy_by_tag(d)
    jobs = {j["name"]: j for j in d.call("ps", all=True)["jobs"]}

    def billed(tag: str) -> float:
        rows = usage_rows(d.state / "vgpu.db", jobs[tag]["id"])
        return sum(r.gpu_seconds for r in rows)
    wait_for(lambda: any(billed(t) > 0 for t in SHARES), timeout=10, what="the bills")
    wrong = {}
    # What `ps` showed of each: its own share, not 0 and the whole GPU.
    if not all(abs(shown.get(t, 0.0) - c / 100) <= 0.06 for t, c in SHARES.items()):
        wrong["ps core_measured"] = shown
    # Never taken for a bypass: no violation, each ran to its end.
    if _all_violations(d):
        wrong["violations"] = [v["detail"] for v in _all_violations(d)]
    if exits != {t: 0 for t in SHARES}:
        wrong["exits"] = exits
    # Each billed about what it ran on the simulated GPU (its own timeline).
    bills = {t: round(billed(t), 2) for t in SHARES}
    if not all(bills[t] == pytest.approx(ran[t], rel=0.15) for t in SHARES):
        wrong["billed GPU-s, ran"] = (bills, {t: round(ran[t], 2) for t in SHARES})
    assert wrong == {}


def test_an_unhooked_burner_in_a_job_is_still_caught(daemon_factory):
    """A job runs a hooked burner at its --core 30 and, beside it, one
    without the hook; a hooked neighbour runs at 60. NVML names one process
    a period; the busy time no gate accounts for is the bypass's job's, which
    is ended. The neighbour is never named."""
    d = _daemon(daemon_factory, "last")
    burn = str(native.burn_program())
    neighbour = d.popen("run", "--mem", "1G", "--core", "60", "--name", "neighbour", "--",
                        burn, "--kernel-us", "1000", "--seconds", "120")
    both = (f"{burn} --kernel-us 1000 --seconds 120 & "
            f"env -u LD_PRELOAD {burn} --kernel-us 1000 --seconds 120; wait")
    bypass = d.popen("run", "--mem", "2G", "--core", "30", "--name", "bypass", "--",
                     "sh", "-c", both)
    try:
        job = wait_for(lambda: next((j for j in d.jobs() if j["name"] == "bypass"), None),
                       timeout=30, what="the bypass job")
        ended = wait_for(lambda: (lambda j: j if j["state"] == "ended" else None)(
            d.call("ps", job=job["id"])["jobs"][0]), timeout=40, what="the bypass job's end")
        found = [v for v in ended["violations"] if v["kind"] == "compute"]
        assert found and found[0]["action"] == "ended", ended["violations"]
        n = next(j for j in d.jobs() if j["name"] == "neighbour")
        assert n["violations"] == [] and neighbour.poll() is None
    finally:
        for p in (neighbour, bypass):
            kill_and_reap(p)
