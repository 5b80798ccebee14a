"""Attacks on the turns as an unprivileged co-tenant would make them
(docs/compute.md, "Turns"): a job of nobody's at --core 30, hooked, lets
itself be measured on short kernels and then runs long ones; beside it
root's job at --core 60. The turns are time, measured by each job's own
events: the attacker gets no more than its share, its neighbour keeps its
own, and neither is billed the other's GPU time."""

from __future__ import annotations

import time

from support.daemon import needs_native, wait_for
from support.hostile import start_job_as_nobody
from support.sim import shares_over

from vgpuctl.system import native

pytestmark = needs_native

G = 1 << 30
WINDOW_S = 4.0


def test_kernels_made_longer_after_they_were_measured_buy_nothing(daemon_factory):
    d = daemon_factory(gpus="1x16G")
    burn = str(native.burn_program())
    env = {k: v for k, v in d.env.items() if k != "LD_PRELOAD"}
    env["PATH"] = "/usr/bin:/bin"
    env["VGPU_SIM_TAG"] = "attacker"
    # 3 s of 50 us kernels to be measured on, then 5 ms kernels
    attack = ["sh", "-c", f"{burn} --kernel-us 50 --seconds 3 --inflight 40 && "
                          f"exec {burn} --kernel-us 5000 --seconds 300"]
    start_job_as_nobody(d.socket, attack, env, 2 * G, 30, hooked=True, name="attacker")
    p = d.popen("run", "--mem", "2G", "--core", "60", "--name", "neighbour", "--",
                burn, "--kernel-us", "1000", "--seconds", "300",
                env={"VGPU_SIM_TAG": "neighbour"})
    try:
        def long_kernels() -> bool:
            rows = {j["name"]: j for j in d.jobs()}
            per = rows.get("attacker", {}).get("per_gpu") or [{}]
            # its hook's measured cost of a launch is past 4 ms: the long ones run
            return "neighbour" in rows and time.monotonic() - t_start > 4.0 and \
                (per[0].get("core_measured") or 0) > 0.2
        t_start = time.monotonic()
        wait_for(long_kernels, timeout=60, what="the attacker to run its long kernels")
        bill0 = {j["name"]: j for j in d.jobs()}
        share = shares_over(d.env, WINDOW_S)
        rows = {j["name"]: j for j in d.jobs()}
    finally:
        d.cleanup_jobs()
        p.wait(timeout=30)
    assert share["attacker"] <= 32, share
    assert share["neighbour"] >= 58, share
    # each is shown (and billed) what it ran: its own hooks' measure
    for t in ("attacker", "neighbour"):
        shown = 100 * (rows[t]["per_gpu"][0]["core_measured"] or 0)
        assert abs(shown - share[t]) <= 3, (t, shown, share)
    assert bill0["attacker"]["state"] == "running"
