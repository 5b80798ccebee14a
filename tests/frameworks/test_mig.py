"""PyTorch and CuPy, unmodified, on a MIG device of a simulated H100 in MIG
mode (1g.10gb x3, 3g.40gb), bare (CUDA_VISIBLE_DEVICES=MIG-...) and under
`vgpuctl run --gpu` with a memory limit: each sees one device with its
memory, trains a torchvision model in mixed precision, and runs cuBLASLt's
fp16 matmul and cuFFT through CuPy (docs/mig.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.daemon import needs_native, vgpuctl_argv
from support.hook import make_sim
from support.sim import run_py, script

pytestmark = needs_native
GiB = 1 << 30
LAYOUT = "0=1g.10gb@0,1g.10gb@1,1g.10gb@2,3g.40gb@4"
BIG = 5     # the 3g.40gb device's index: 1 GPU, 1 + 8 x 0 + its start (4)

TORCH = """
import torch, torchvision
res = {"count": torch.cuda.device_count(), "mem": list(torch.cuda.mem_get_info()),
       "name": torch.cuda.get_device_name(0),
       "sms": torch.cuda.get_device_properties(0).multi_processor_count}
m = torchvision.models.resnet18(num_classes=10).cuda()
opt = torch.optim.SGD(m.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cuda")
xb = torch.randn(8, 3, 64, 64, device="cuda")
yb = torch.randint(0, 10, (8,), device="cuda")
for _ in range(2):
    opt.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = torch.nn.functional.cross_entropy(m(xb), yb)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
torch.cuda.synchronize()
res["amp_loss_dtype"] = str(loss.dtype)
out(res)
"""

CUPY = """
import cupy as cp
a = cp.ones((512, 256), dtype=cp.float16)
b = cp.ones((256, 128), dtype=cp.float16)
res = {"fp16_matmul": list((a @ b).shape),
       "fft": list(cp.fft.fft(cp.ones(1024, dtype=cp.complex64)).shape),
       "count": cp.cuda.runtime.getDeviceCount(),
       "total": cp.cuda.Device(0).mem_info[1]}
cp.cuda.Device().synchronize()
out(res)
"""


def _big_uuid(env: dict[str, str], tmp_path) -> str:
    """The 3g.40gb device's MIG- UUID, as `vgpuctl gpus` reads NVML."""
    r = subprocess.run([*vgpuctl_argv(), "gpus", "--format", "json"],
                       env={**env, "VGPU_SOCKET": str(tmp_path / "none.sock")},
                       capture_output=True, text=True, timeout=60, check=True)
    return next(g["uuid"] for g in json.loads(r.stdout) if g["index"] == BIG)


def test_pytorch_and_cupy_run_bare_on_a_mig_device(tmp_path):
    pytest.importorskip("torch")
    sim = make_sim(tmp_path, "1x80G", VGPU_SIM_MIG=LAYOUT)
    env = {**sim.env, "CUDA_VISIBLE_DEVICES": _big_uuid(sim.env, tmp_path)}
    res = run_py(env, TORCH, timeout=300)
    assert res["count"] == 1 and res["mem"][1] == 40 * GiB, res
    assert res["sms"] == 48 and "MIG 3g.40gb" in res["name"], res
    assert res["amp_loss_dtype"] == "torch.float32"
    pytest.importorskip("cupy")
    res = run_py(env, CUPY, timeout=180)
    assert res == {"fp16_matmul": [512, 128], "fft": [1024], "count": 1, "total": 40 * GiB}


def test_pytorch_and_cupy_run_under_vgpuctl_on_a_mig_device(daemon_factory):
    pytest.importorskip("torch")
    d = daemon_factory(gpus="1x80G", start=False)
    d.env["VGPU_SIM_MIG"] = LAYOUT
    d.start()
    for code, key in ((TORCH, "amp_loss_dtype"), (CUPY, "fft")):
        r = d.cli("run", "--gpu", str(BIG), "--mem", "4G", "-q", "--", sys.executable, "-c",
                  script(code), timeout=300)
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout.strip().splitlines()[-1])
        assert key in res
        if "mem" in res:
            assert res["count"] == 1 and res["mem"][1] == 4 * GiB, res
        else:
            assert res["count"] == 1 and res["total"] == 4 * GiB, res
