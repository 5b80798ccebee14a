"""Two PyTorch training loops on one GPU, at --core 30 and --core 60 (hard):
each gets its share of the simulated GPU's time, within 2 points, as the
simulator's own timeline records it (busy time per VGPU_SIM_TAG); two loops
of the same program, and of two programs (a small CNN beside torchvision's
ResNet-18), whose kernels differ in number and in length."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.daemon import needs_native, read_line, vgpuctl_argv, wait_for

pytestmark = needs_native

# The training loop bench/frameworks.py measures: a small CNN trained with SGD.
LOOP = Path(__file__).resolve().parents[2] / "bench" / "frameworks.py"
SHARES = {"t30": 30, "t60": 60}
WINDOW_S = 10.0


def busy_by_tag(env: dict[str, str]) -> tuple[float, dict[str, int]]:
    t = time.monotonic()
    r = subprocess.run([*vgpuctl_argv(), "sim", "stats", "--json"], env=env, capture_output=True,
                       text=True, timeout=60, check=True)
    return t, {x["name"]: x["devices"][0]["busy_ns"] for x in json.loads(r.stdout)["tags"]}


@pytest.mark.parametrize("models", [("cnn", "cnn"), ("cnn", "resnet18")],
                         ids=["same-program", "two-programs"])
def test_two_training_loops_get_their_shares(daemon_factory, models):
    d = daemon_factory(gpus="1x16G")
    # Kernels of 50 us per wave: each loop alone would keep the GPU busy, so
    # what each gets is the share vgpuctl holds it to.
    env = {"VGPU_SIM_NS_PER_BLOCK": "50000"}
    jobs = [d.popen("run", "--mem", "2G", "--core", str(core), "--policy", "hard",
                    "--name", tag, "--",
                    sys.executable, str(LOOP), "--loop", "120", "--model", model,
                    env={**env, "VGPU_SIM_TAG": tag})
            for (tag, core), model in zip(SHARES.items(), models, strict=True)]
    try:
        for j in jobs:
            assert "ready" in read_line(j.stdout, timeout=120), j.stderr.read()
        # Start the window once the daemon's own measure has each at its share.
        def settled() -> bool:
            rows = {j["name"]: j for j in d.jobs()}
            return all(abs((rows[t].get("core_measured") or 0) - c / 100) < 0.03
                       for t, c in SHARES.items() if t in rows) and len(rows) == 2
        wait_for(settled, timeout=60, what="both loops to settle at their shares")
        a = busy_by_tag(d.env)
        time.sleep(WINDOW_S)  # the measurement window
        b = busy_by_tag(d.env)
    finally:
        d.cleanup_jobs()
        for j in jobs:
            j.wait(timeout=30)
    window_ns = (b[0] - a[0]) * 1e9
    shares = {tag: (b[1][tag] - a[1][tag]) / window_ns * 100 for tag in SHARES}
    for tag, core in SHARES.items():
        assert abs(shares[tag] - core) <= 2, shares
