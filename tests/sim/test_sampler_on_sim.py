"""The sampler against the simulated GPU's own NVML: the timestamps, the
sample period and smUtil are read as NVML specifies them, and what the
sampler measures is what the simulator's timeline recorded. In a subprocess,
as everything that loads the simulated libraries."""

from __future__ import annotations

import itertools
import os
import subprocess
from pathlib import Path

import pytest
from support.sim import run_py

from vgpuctl.system import native
from vgpuctl.system.region import DeviceLimit, Region, const

SNIPPET = """
import pynvml
from vgpuctl.system import native
from vgpuctl.system import sim
from vgpuctl.governor.sampler import Sampler

sim.use_in_process()
pynvml.nvmlInit()
uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
lib = ctypes.CDLL(str(native.sim_libdir() / "libnvidia-ml.so.1"))
lib.vgpu_sim_ctl_stats.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
buf = ctypes.create_string_buffer(1 << 20)

def sim_busy_ns(pid):
    lib.vgpu_sim_ctl_stats(buf, len(buf))
    for p in json.loads(buf.value.decode())["processes"]:
        if p["pid"] == pid:
            return p["devices"][0]["busy_ns"]
    return 0

pid = int(os.environ["BURN_PID"])
s = Sampler(pynvml)
windows = []
t_first = b_first = None
deadline = time.monotonic() + 30
while len(windows) < 12 and time.monotonic() < deadline:
    w = s.read(uuid)
    if w is not None and pid in w.busy_s:
        if t_first is None:     # from the first window on, count both sides
            t_first, b_first = time.monotonic(), sim_busy_ns(pid)
        else:
            windows.append((w.start_us, w.end_us, w.busy_s[pid], w.coarse))
    time.sleep(0.02)
t_last, b_last = time.monotonic(), sim_busy_ns(pid)
out({"windows": windows, "period_s": s.period_s(uuid),
     "sim_share": (b_last - b_first) / ((t_last - t_first) * 1e9),
     "now_us": time.time_ns() // 1000})
"""


UUID_SNIPPET = """
import pynvml
from vgpuctl.system import sim
sim.use_in_process()
pynvml.nvmlInit()
u = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
out(u.decode() if isinstance(u, bytes) else u)
"""


@pytest.mark.parametrize("idle", ["average", "skip"])
def test_sampler_measures_what_the_simulator_ran(sim_env: dict[str, str], burn_program: Path,
                                                 tmp_path: Path, idle: str) -> None:
    """Whether the simulated NVML averages idle periods in or skips them,
    the sampler, reading faster than the sample period, sees one period a
    read and measures the busy time run."""
    sim_env["VGPU_SIM"] = "1x16G"
    sim_env["VGPU_SIM_SAMPLE_MS"] = "167"
    sim_env["VGPU_SIM_UTIL_IDLE"] = idle
    # a burner held at about 30 % by a fixed gate (300 launches/s of 1 ms),
    # so that the GPU is far from full and nothing is clamped
    uuid = run_py(sim_env, UUID_SNIPPET)
    Region.create(tmp_path / "job", "1", os.getuid(),
                  [DeviceLimit(uuid=uuid, core_share=30, throttle=True,
                               refill_rate=300 * const("VGPU_TOKEN_SCALE"),
                               bucket_size=10 * const("VGPU_TOKEN_SCALE"))])
    env = {**sim_env, "LD_PRELOAD": str(native.hook_library()),
           "VGPU_REGION": str(tmp_path / "job"), "VGPU_JOB": "1"}
    burner = subprocess.Popen([str(burn_program), "--kernel-us", "1000", "--seconds", "60"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        res = run_py({**sim_env, "BURN_PID": str(burner.pid)}, SNIPPET, timeout=90)
    finally:
        burner.kill()
        burner.wait(timeout=30)
    wins = res["windows"]
    assert len(wins) >= 10, res
    # the period is learnt from the timestamps (microseconds of CPU time)
    assert res["period_s"] == pytest.approx(0.167, rel=0.05)
    # windows tile the timeline: each starts where the previous one ended,
    # and each covers one sample period
    for (_, end, _, _), (start, _, _, _) in itertools.pairwise(wins):
        assert start == end
    assert not any(coarse for *_, coarse in wins)
    # and they are recent CPU times in microseconds, as NVML's
    assert abs(res["now_us"] - wins[-1][1]) < 5_000_000
    span_s = (wins[-1][1] - wins[0][0]) / 1e6
    measured = sum(b for _, _, b, _ in wins) / span_s
    # the sampler agrees with the simulator's own record within NVML's
    # rounding and the windows' edges
    assert res["sim_share"] == pytest.approx(0.3, abs=0.1)
    assert measured == pytest.approx(res["sim_share"], abs=0.03)
