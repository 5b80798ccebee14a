"""PyTorch and CuPy jobs suspended, moved to the other GPU and resumed on the
simulated GPU (docs/suspend.md): a training loop with each of PyTorch's
allocators (its caching allocator's pool, `cudaMallocAsync`'s stream-ordered
pool, VMM `expandable_segments`) and a CUDA graph, CuPy's memory pool and
its stream-ordered pool. Kernels compute nothing on the simulator, so what
is checked is what a move could break: every byte of every tensor (put there
by copies) is what it was, and the framework goes on working (another
training step, a graph replay, a kernel launch) on the new GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.daemon import needs_native, wait_for
from support.talk import Talker

pytestmark = needs_native

# A PyTorch job: a torchvision model trained a few steps (its weights from
# the CPU, so they are real bytes), optimizer state, a CUDA graph captured
# and replayed, and a cached pool (tensors freed into the allocator's
# cache). "check" digests every tensor and the GPU it is on; "step" trains
# one step more and replays the graph.
TORCH_JOB = r"""
import hashlib, json, sys, torch, torchvision
torch.manual_seed(0)
m = torchvision.models.resnet18(num_classes=10)
m = m.cuda()
opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
xb = torch.randn(4, 3, 32, 32).cuda()
yb = torch.randint(0, 10, (4,)).cuda()
def step():
    opt.zero_grad()
    torch.nn.functional.cross_entropy(m(xb), yb).backward()
    opt.step()
for _ in range(2):
    step()
junk = [torch.empty(8 << 20, dtype=torch.uint8, device="cuda") for _ in range(4)]
del junk                              # back into the allocator's cache
static = torch.randn(64, 64).cuda()
g = torch.cuda.CUDAGraph()
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(2):
        static @ static
torch.cuda.current_stream().wait_stream(s)
with torch.cuda.graph(g):
    out_ = static @ static
g.replay()
torch.cuda.synchronize()
def digest():
    h = hashlib.sha256()
    for t in [*m.state_dict().values(), *[v for st in opt.state.values() for v in st.values()
              if torch.is_tensor(v)], static, xb, yb]:
        h.update(t.detach().cpu().numpy().tobytes())
    return h.hexdigest()
def uuid():   # the driver's word (the runtime keeps what it read at start)
    import ctypes, uuid as u
    b = ctypes.create_string_buffer(16)
    ctypes.CDLL("libcuda.so.1").cuDeviceGetUuid_v2(b, 0)
    return "GPU-" + str(u.UUID(bytes=b.raw))
print(json.dumps({"ready": digest(), "uuid": uuid(),
                  "reserved": torch.cuda.memory_reserved()}), flush=True)
for line in sys.stdin:
    if line.strip() == "check":
        print(json.dumps({"digest": digest(), "uuid": uuid()}), flush=True)
    else:
        step(); g.replay(); torch.cuda.synchronize()
        print(json.dumps({"stepped": True, "reserved": torch.cuda.memory_reserved()}),
              flush=True)
"""

# A CuPy job: arrays from NumPy in CuPy's memory pool, or in its
# stream-ordered pool (cudaMallocAsync), and an NVRTC kernel.
CUPY_JOB = r"""
import hashlib, json, sys, numpy as np, cupy as cp
if sys.argv[1] == "async":
    cp.cuda.set_allocator(cp.cuda.MemoryAsyncPool().malloc)
rng = np.random.default_rng(0)
arrays = [cp.asarray(rng.standard_normal(n)) for n in (1 << 20, 3 << 18, 12345)]
freed = [cp.empty(4 << 20, dtype=cp.uint8) for _ in range(3)]
del freed
add = cp.RawKernel(r'extern "C" __global__ void add(float *x) { x[threadIdx.x] += 1; }', "add")
scratch = cp.zeros(32, dtype=cp.float32)
add((1,), (32,), (scratch,))
cp.cuda.Device().synchronize()
def digest():
    return hashlib.sha256(b"".join(cp.asnumpy(a).tobytes() for a in arrays)).hexdigest()
def uuid():   # the driver's word (the runtime keeps what it read at start)
    import ctypes, uuid as u
    b = ctypes.create_string_buffer(16)
    ctypes.CDLL("libcuda.so.1").cuDeviceGetUuid_v2(b, 0)
    return "GPU-" + str(u.UUID(bytes=b.raw))
print(json.dumps({"ready": digest(), "uuid": uuid()}), flush=True)
for line in sys.stdin:
    if line.strip() == "check":
        print(json.dumps({"digest": digest(), "uuid": uuid()}), flush=True)
    else:
        more = cp.asarray(rng.standard_normal(1 << 16))
        add((1,), (32,), (scratch,))
        cp.cuda.Device().synchronize()
        print(json.dumps({"stepped": float(cp.asnumpy(more).sum()) != 0.0}), flush=True)
"""


class Job(Talker):
    what = "the job"
    reply_s = 300.0

    def __init__(self, daemon, code: str, *args: str, env: dict[str, str] | None = None):
        self.listen(daemon.popen("run", "--mem", "6G", "--gpu", "0", "--", sys.executable,
                                 "-c", code, *args, stdin=subprocess.PIPE, env=env))

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


def gpu_uuids(daemon) -> list[str]:
    return [g["uuid"] for g in sorted(daemon.call("ps")["gpus"], key=lambda g: g["index"])]


def suspend_move_resume(daemon, job: Job) -> None:
    """The job ready on GPU 0: suspended, resumed on GPU 1, and back by a
    drain of GPU 1; after each, every tensor as it was and one more step."""
    ready = job.reply()
    uuids = gpu_uuids(daemon)
    assert ready["uuid"] == uuids[0]
    jid = wait_for(lambda: next((j["id"] for j in daemon.jobs() if j["state"] == "running"),
                                None), 60, "the job running")
    res = daemon.cli("suspend", jid, timeout=300)
    assert res.returncode == 0, res.stderr
    assert daemon.job(jid)["state"] == "suspended"
    res = daemon.cli("resume", jid, "--gpu", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    assert job.talk("check") == {"digest": ready["ready"], "uuid": uuids[1]}
    assert job.talk("step")["stepped"]
    after = job.talk("check")
    res = daemon.cli("drain", "1", timeout=300)
    assert res.returncode == 0 and f"job {jid}: moved to GPU 0" in res.stdout, res
    assert job.talk("check") == {"digest": after["digest"], "uuid": uuids[0]}
    assert job.talk("step")["stepped"]


@pytest.mark.parametrize("alloc", ["native", "backend:cudaMallocAsync",
                                   "expandable_segments:True"])
def test_a_pytorch_training_job_survives_suspend_and_moves(daemon_factory, alloc):
    pytest.importorskip("torchvision")
    d = daemon_factory("2x16G")
    env = {} if alloc == "native" else {"PYTORCH_CUDA_ALLOC_CONF": alloc}
    job = Job(d, TORCH_JOB, env=env)
    try:
        suspend_move_resume(d, job)
    finally:
        job.close()


@pytest.mark.parametrize("pool", ["default", "async"])
def test_a_cupy_job_survives_suspend_and_moves(daemon_factory, pool):
    pytest.importorskip("cupy")
    d = daemon_factory("2x16G")
    job = Job(d, CUPY_JOB, pool)
    try:
        suspend_move_resume(d, job)
    finally:
        job.close()
