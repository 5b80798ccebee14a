"""PyTorch, unmodified, on the simulated GPU: what users run (matmul,
convolutions with backward, CUDA graphs, a torchvision model trained with
mixed precision), bare and under `vgpuctl run --mem 2G` with each of
PyTorch's allocators. Kernels do not execute on the simulator (values are
zeros); what is checked is that every call the framework makes succeeds or
fails as on a GPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.daemon import needs_native, vgpuctl_argv
from support.sim import run_py

pytestmark = needs_native
GiB = 1 << 30

BARE = """
import torch, torchvision
res = {"available": torch.cuda.is_available(), "count": torch.cuda.device_count(),
       "mem": list(torch.cuda.mem_get_info())}
a = torch.randn(256, 256, device="cuda")
res["matmul"] = list((a @ a).shape)
conv = torch.nn.Conv2d(3, 8, 3).cuda()
x = torch.randn(2, 3, 32, 32, device="cuda", requires_grad=True)
conv(x).sum().backward()
res["conv_grad"] = list(x.grad.shape)
s = torch.randn(64, 64, device="cuda")
g = torch.cuda.CUDAGraph()
torch.cuda.synchronize()
with torch.cuda.graph(g):
    y = s @ s
for _ in range(3):
    g.replay()
torch.cuda.synchronize()
res["graph"] = list(y.shape)
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


def test_pytorch_bare(sim):
    res = run_py(sim.env, BARE, timeout=300)
    assert res["available"] is True and res["count"] == 2
    assert res["mem"][1] == 16 * GiB
    assert res["matmul"] == [256, 256]
    assert res["conv_grad"] == [2, 3, 32, 32]
    assert res["graph"] == [64, 64]
    assert res["amp_loss_dtype"] == "torch.float32"  # cross_entropy autocasts to float32


# Allocate 256 MiB blocks until PyTorch says out of memory, drop them (the
# allocator keeps them cached, or in its pool), then ask the runtime itself
# for 1 GiB beside what PyTorch holds; report what it saw.
UNDER_LIMIT = r"""
import ctypes, glob, json, os, torch
free, total = torch.cuda.mem_get_info()
held, oom = [], None
try:
    for _ in range(64):
        held.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError as e:
    oom = type(e).__name__
blocks = len(held)
del held
torch.cuda.synchronize()
cudart = ctypes.CDLL(glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia",
                                            "cu13", "lib", "libcudart.so.*"))[0])
p = ctypes.c_void_p()
beside = cudart.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 30))
print(json.dumps({"total": total, "free": free, "oom": oom, "blocks": blocks,
                  "beside": beside}))
"""


@pytest.mark.parametrize("alloc_conf", ["", "expandable_segments:True",
                                        "backend:cudaMallocAsync"])
def test_pytorch_under_a_2g_limit(daemon_factory, alloc_conf):
    """mem_get_info shows the job's 2 GiB; allocating past it is
    torch.OutOfMemoryError with every allocator; what the allocator keeps
    after the tensors are gone (its cache, or cudaMallocAsync's pool) still
    counts, so 1 GiB more from the runtime is refused; and the simulator's own
    record of the job's device memory never exceeds the limit."""
    d = daemon_factory(gpus="1x16G")
    tag = "torch-" + (alloc_conf.split(":")[0] or "default")
    env = {"PYTORCH_CUDA_ALLOC_CONF": alloc_conf, "VGPU_SIM_TAG": tag}
    r = d.cli("run", "--mem", "2G", "--", sys.executable, "-c", UNDER_LIMIT, env=env,
              timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["total"] == 2 * GiB
    assert res["oom"] == "OutOfMemoryError"
    assert 1 <= res["blocks"] < 8
    assert res["beside"] == 2  # cudaErrorMemoryAllocation
    stats = subprocess.run([*vgpuctl_argv(), "sim", "stats", "--json"], env=d.env,
                           capture_output=True, text=True, timeout=60, check=True)
    record = next(t for t in json.loads(stats.stdout)["tags"] if t["name"] == tag)
    assert 0 < record["devices"][0]["peak"] <= 2 * GiB
