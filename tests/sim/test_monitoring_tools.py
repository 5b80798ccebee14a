"""Monitoring tools people run against NVML, unmodified, on the simulated GPU
(issue 15): nvitop and gpustat list the GPUs and the process that holds
memory on one, and exit 0."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from support.sim import HOLD_1G_ON_GPU1, holding

GiB = 1 << 30



def tool(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def test_nvitop_once_shows_the_gpus_and_the_process(sim_env):
    with holding(sim_env, HOLD_1G_ON_GPU1) as holder:
        res = tool(sim_env, "nvitop", "--once")
        holder.stop()
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "FunctionNotFound" not in res.stderr, res.stderr
    out = res.stdout
    assert out.count("vgpu-sim GPU") == 2, out
    assert "580.65.06" in out and "700W" in out, out
    rows = [ln for ln in out.splitlines() if re.search(rf"\b{holder.report['pid']}\b", ln)]
    assert len(rows) == 1, out
    assert re.match(r"^│\s+1\s", rows[0]), rows[0]     # on GPU 1
    assert "1324MiB" in rows[0], rows[0]                # 1 GiB and the context's 300 MiB


def test_gpustat_shows_the_gpus_and_the_process(sim_env):
    with holding(sim_env, HOLD_1G_ON_GPU1) as holder:
        text = tool(sim_env, "gpustat", "--show-all", "--no-color")
        res = tool(sim_env, "gpustat", "--json")
        holder.stop()
    assert text.returncode == 0, text.stdout + text.stderr
    assert f"/{holder.report['pid']}(1324M)" in text.stdout, text.stdout
    assert res.returncode == 0, res.stderr
    gpus = json.loads(res.stdout)["gpus"]
    assert [g["name"] for g in gpus] == ["vgpu-sim GPU"] * 2
    assert gpus[0]["processes"] == []
    (proc,) = gpus[1]["processes"]
    assert proc["pid"] == holder.report["pid"]
    assert proc["gpu_memory_usage"] == (GiB + 300 * (1 << 20)) >> 20   # MiB
    assert gpus[1]["enforced.power.limit"] == 700
    assert gpus[1]["temperature.gpu"] > 0 and gpus[1]["fan.speed"] is None
