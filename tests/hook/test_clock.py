"""The hook's clock (libvgpu/hook/clock.c): CLOCK_MONOTONIC read from the
time-stamp counter between anchors, where the kernel keeps time by it.
tests/c/clock_check.c reads it between two clock_gettime calls on two
threads for 300 ms (its calibration included) and reports how far a
reading ever fell outside them."""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path

from support import REPO

HOOK_DIR = REPO / "libvgpu" / "hook"
CLOCKSOURCE = Path("/sys/devices/system/clocksource/clocksource0/current_clocksource")
# The turns are ms long; the clock's error is the counter's rate's over an
# anchor's 1 ms (tens of ns): a microsecond is wrong.
WORST_NS = 1000


def test_the_hook_clock_is_clock_monotonic_and_never_goes_back(cbuild):
    prog = cbuild("clock_check", "clock_check.c", f"-I{HOOK_DIR}", str(HOOK_DIR / "clock.c"))
    res = subprocess.run([str(prog), "300"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    source = CLOCKSOURCE.read_text().strip() if CLOCKSOURCE.exists() else ""
    assert out["counts"] == int(source == "tsc" and platform.machine() == "x86_64")
    assert out["back"] == 0
    assert out["worst_ns"] <= WORST_NS, out
    assert out["reads"] > 1000
