"""PyTorch and CuPy, unmodified, on a MIG device of a simulated H100 in MIG
mode (1g.10gb x3, 3g.40gb), bare (CUDA_VISIBLE_DEVICES=MIG-...) and under
`vgpuctl run --gpu` with a memory limit and a share (docs/mig.md): each sees
one device, of the device's size or of its limit, and the model zoo's stock
programs (tests/frameworks/zoo.py: torchvision's ResNet-18 in fp16 with
GradScaler, GPT-2 from its configuration in bf16, CuPy <-> PyTorch, cuFFT)
run on it as on a whole GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.daemon import needs_native, vgpuctl_argv
from support.hook import make_sim
from support.sim import run_py, script

pytestmark = needs_native
GiB = 1 << 30
LAYOUT = "0=1g.10gb@0,1g.10gb@1,1g.10gb@2,3g.40gb@4"
BIG = 5     # the 3g.40gb device's index: 1 GPU, 1 + 8 x 0 + its start (4)
ZOO = Path(__file__).resolve().parent / "zoo.py"
RUNS = [("resnet18", "fp16"), ("gpt2", "bf16"), ("interop", None), ("fft", None)]
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

# What each framework says the device is.
SEEN = """
import torch, cupy as cp
p = torch.cuda.get_device_properties(0)
out({"torch": [torch.cuda.device_count(), torch.cuda.mem_get_info()[1], p.multi_processor_count],
     "cupy": [cp.cuda.runtime.getDeviceCount(), cp.cuda.Device(0).mem_info[1]],
     "name": torch.cuda.get_device_name(0)})
"""


def _zoo_ok(stdout: str, stderr: str, model: str, mode: str | None) -> None:
    lines = [json.loads(ln) for ln in stdout.splitlines() if ln.startswith("{")]
    assert lines and all(ln.get("ok") for ln in lines), stdout + stderr[-4000:]
    assert [ln["mode"] for ln in lines] == [mode or "case"], stdout


def _big_uuid(env: dict[str, str], tmp_path: Path) -> str:
    """The 3g.40gb device's MIG- UUID, as `vgpuctl gpus` reads NVML."""
    r = subprocess.run([*vgpuctl_argv(), "gpus", "--format", "json"],
                       env={**env, "VGPU_SOCKET": str(tmp_path / "none.sock")},
                       capture_output=True, text=True, timeout=60, check=True)
    return next(g["uuid"] for g in json.loads(r.stdout) if g["index"] == BIG)


def test_the_frameworks_run_bare_on_a_mig_device(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("cupy")
    sim = make_sim(tmp_path, "1x80G", VGPU_SIM_MIG=LAYOUT)
    env = {**sim.env, **OFFLINE, "CUDA_VISIBLE_DEVICES": _big_uuid(sim.env, tmp_path)}
    seen = run_py(env, SEEN, timeout=300)
    assert seen["torch"] == [1, 40 * GiB, 48] and seen["cupy"] == [1, 40 * GiB], seen
    assert seen["name"].endswith("MIG 3g.40gb"), seen
    for model, mode in RUNS:
        r = subprocess.run([sys.executable, str(ZOO), model, *([mode] if mode else [])],
                           env=env, capture_output=True, text=True, timeout=600)
        _zoo_ok(r.stdout, r.stderr, model, mode)
        assert r.returncode == 0, r.stderr[-4000:]


def test_the_frameworks_run_under_vgpuctl_on_a_mig_device(daemon_factory):
    pytest.importorskip("torch")
    pytest.importorskip("cupy")
    d = daemon_factory(gpus="1x80G", start=False)
    d.env["VGPU_SIM_MIG"] = LAYOUT
    d.start()
    run = ["run", "--gpu", str(BIG), "--mem", "8G", "--core", "50", "-q", "--"]
    r = d.cli(*run, sys.executable, "-c", script(SEEN), timeout=300)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["torch"] == [1, 8 * GiB, 48] and seen["cupy"] == [1, 8 * GiB], seen
    for model, mode in RUNS:
        r = d.cli(*run, sys.executable, str(ZOO), model, *([mode] if mode else []),
                  env=OFFLINE, timeout=600)
        _zoo_ok(r.stdout, r.stderr, model, mode)
        assert r.returncode == 0, r.stderr[-4000:]
