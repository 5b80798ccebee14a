"""Memory the processes of a job share (the ranks of NCCL and PyTorch): a VMM
allocation exported as a POSIX fd by one process and imported by another is
charged once, to the process and GPU that allocated it, never again to the
importer; host-located cuMemCreate (NCCL's cuMem host buffers) is not
device memory; and a job's processes on two GPUs are each charged on their
own GPU, by UUID."""

from __future__ import annotations

import pytest
from support.hook import CUDA_ERROR_OUT_OF_MEMORY, GiB, MiB, slot_of
from support.sim import holding


def test_an_exported_allocation_is_charged_once_to_its_exporter(sim, clients, client_factory):
    region = sim.region([2 * GiB, 2 * GiB])
    env = sim.job_env(region.path)
    exporter = client_factory(clients["direct"], [
        "ctx", "1", "createfd", "512M", "export", "0", "hold", "memrelease", "0", "hold"], env)
    fd = exporter.until("export")
    assert fd[0] == "0", exporter.stderr_now()
    exporter.until("hold")
    importer = client_factory(clients["direct"], [
        "ctx", "1", "import", str(exporter.pid), fd[1], "hold",
        "createfd", "800M", "createfd", "200M", "hold", "memrelease", "0", "hold"], env)
    assert importer.until("import")[0] == "0", importer.stderr_now()
    importer.until("hold")

    def used(pid: int) -> tuple[int, int]:
        """(what the job's slot of pid holds on GPU 1, the simulator's record)"""
        return slot_of(region, pid).used[1], sim.process_used(pid, 1)

    ctx_e = slot_of(region, exporter.pid).ctx_bytes[1]
    ctx_i = slot_of(region, importer.pid).ctx_bytes[1]
    assert ctx_e > 0 and ctx_i > 0
    assert used(exporter.pid) == (ctx_e + 512 * MiB,) * 2
    assert used(importer.pid) == (ctx_i, ctx_i)           # its context, nothing imported
    job = region.read_usage().devices[1].used
    assert job == ctx_e + ctx_i + 512 * MiB                # once, not twice, not never
    assert region.read_usage().devices[0].used == 0        # and on its own GPU
    # The import takes nothing of the limit (800M more fit in the 2G), and
    # the exporter's 512M still count (200M more don't).
    importer.go()
    assert importer.until("createfd")[0] == "0"
    assert importer.until("createfd")[0] == str(CUDA_ERROR_OUT_OF_MEMORY)
    importer.until("hold")
    job += 800 * MiB
    # The importer lets go of its imported handle (handle 0): nothing of the
    # job's count moves.
    importer.go()
    assert importer.until("memrelease") == ["0"]
    importer.until("hold")
    assert region.read_usage().devices[1].used == job
    # The exporter lets go: its 512M leave the job.
    exporter.go()
    assert exporter.until("memrelease") == ["0"]
    exporter.until("hold")
    assert region.read_usage().devices[1].used == ctx_e + ctx_i + 800 * MiB
    exporter.go()
    importer.go()
    assert exporter.finish()[0] == 0 and importer.finish()[0] == 0


def test_host_located_cuMemCreate_is_not_device_memory(sim, clients, client_factory):
    region = sim.region([GiB, GiB])
    c = client_factory(clients["direct"], ["ctx", "0", "hold", "createhost", "1G", "hold",
                                           "create", "600M", "hold"],
                       sim.job_env(region.path))
    c.until("hold")
    base = region.read_usage().devices[0].used
    c.go()
    assert c.until("createhost")[0] == "0", c.stderr_now()
    c.until("hold")
    assert region.read_usage().devices[0].used == base == sim.process_used(c.pid)
    c.go()
    assert c.until("create")[0] == "0"         # the 1G of host memory took none of the limit
    c.until("hold")
    c.go()
    assert c.finish()[0] == 0


def test_a_process_on_each_gpu_is_charged_on_its_own_gpu(sim, clients, client_factory):
    """Two ranks of a job, each on one of its GPUs (the job given GPUs 1 and
    0, in that order: CUDA_VISIBLE_DEVICES by UUID): each is charged on its
    own physical GPU, limited by that GPU's limit."""
    region = sim.region({1: GiB, 0: 2 * GiB})
    env = sim.job_env(region.path, CUDA_VISIBLE_DEVICES=f"{sim.uuids[1]},{sim.uuids[0]}")
    ranks = [client_factory(clients["direct"], ["ctx", str(r), "count", "alloc", "512M",
                                                "alloc", "600M", "hold"], env)
             for r in (0, 1)]
    for r, c in enumerate(ranks):
        assert c.until("count") == ["0", "2"]
        assert c.until("alloc")[0] == "0"
        # rank 0 is on GPU 1 (1G): its second allocation is refused
        assert c.until("alloc")[0] == ("0" if r == 1 else str(CUDA_ERROR_OUT_OF_MEMORY))
        c.until("hold")
    # region device 0 is GPU 1, device 1 is GPU 0
    assert sim.process_used(ranks[0].pid, 0) == 0 < sim.process_used(ranks[0].pid, 1)
    assert sim.process_used(ranks[1].pid, 1) == 0 < sim.process_used(ranks[1].pid, 0)
    usage = region.read_usage()
    assert usage.devices[0].used == sim.process_used(ranks[0].pid, 1)
    assert usage.devices[1].used == sim.process_used(ranks[1].pid, 0)
    for c in ranks:
        c.go()
        assert c.finish()[0] == 0


# cuMemAlloc memory shared through CUDA IPC, as PyTorch's CUDA tensors are
# between processes (torch.multiprocessing) and NCCL's buffers with
# NCCL_CUMEM_ENABLE=0: the exporter on GPU 1 holds 512M and its IPC handle.
IPC_EXPORT = """
ck(cu.cuInit(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(1)); ck(cu.cuCtxSetCurrent(ctx))
p = ck(cu.cuMemAlloc(512 << 20))
try:
    r = cu.cuIpcGetMemHandle(p)
except Exception as e:      # a driver without the entry point
    r = (type(e).__name__,)
if r[0] != cu.CUresult.CUDA_SUCCESS:
    out({"ipc": r[0] if isinstance(r[0], str) else err(r)})
else:
    out({"ipc": "CUDA_SUCCESS", "handle": ctypes.string_at(r[1].getPtr(), 64).hex(),
         "pid": os.getpid()})
"""

IPC_OPEN = """
ck(cu.cuInit(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(1)); ck(cu.cuCtxSetCurrent(ctx))
h = cu.CUipcMemHandle()
ctypes.memmove(h.getPtr(), bytes.fromhex(os.environ["IPC_HANDLE"]), 64)
p = ck(cu.cuIpcOpenMemHandle(h, cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
out({"opened": True, "pid": os.getpid()})
"""


def test_memory_opened_through_cuda_ipc_is_charged_once_to_its_exporter(sim):
    region = sim.region([2 * GiB, 2 * GiB])
    env = sim.job_env(region.path)
    with holding(env, IPC_EXPORT) as exporter:
        if exporter.report["ipc"] != "CUDA_SUCCESS":
            pytest.skip(f"the simulated GPU has no CUDA IPC here: {exporter.report['ipc']}")
        with holding({**env, "IPC_HANDLE": exporter.report["handle"]}, IPC_OPEN) as importer:
            ctx_e = slot_of(region, exporter.pid).ctx_bytes[1]
            ctx_i = slot_of(region, importer.pid).ctx_bytes[1]
            assert slot_of(region, exporter.pid).used[1] == ctx_e + 512 * MiB
            assert slot_of(region, importer.pid).used[1] == ctx_i    # the open: nothing
            assert region.read_usage().devices[1].used == ctx_e + ctx_i + 512 * MiB
            assert sim.process_used(importer.pid, 1) == ctx_i


# -- a handle's memory lives until it is released and unmapped -------------------

def test_a_released_handle_still_mapped_stays_charged(sim, clients, client_factory):
    """The driver frees a cuMemCreate allocation when its handle is released
    and its last mapping unmapped, in either order: the charge goes then.
    Otherwise create, map, release, again would hold any amount of memory
    charged to no one."""
    region = sim.region([GiB, GiB])
    c = client_factory(clients["direct"], [
        "ctx", "0", "hold", "create", "512M", "map", "0", "512M", "memrelease", "0", "hold",
        "create", "512M", "hold", "unmap", "1", "hold"], sim.job_env(region.path))
    c.until("hold")
    base = region.read_usage().devices[0].used
    c.go()
    assert c.until("create")[0] == "0" and c.until("map")[0] == "0"
    assert c.until("memrelease") == ["0"]
    c.until("hold")
    assert region.read_usage().devices[0].used == base + 512 * MiB == sim.process_used(c.pid)
    c.go()
    # the next 512M don't fit beside the first, still mapped, and the context
    assert c.until("create")[0] == str(CUDA_ERROR_OUT_OF_MEMORY)
    c.until("hold")
    c.go()
    assert c.until("unmap") == ["0"]
    c.until("hold")
    assert region.read_usage().devices[0].used == base == sim.process_used(c.pid)
    c.go()
    assert c.finish()[0] == 0


def test_ncclcumemfree_gives_the_memory_back_at_its_last_step(sim, clients, client_factory):
    """NCCL frees its cuMem buffers this way: retain the handle from the
    address, release it, unmap, release the creator's handle."""
    region = sim.region([GiB, GiB])
    c = client_factory(clients["direct"], [
        "ctx", "0", "hold", "create", "256M", "map", "0", "256M", "retain", "1",
        "memrelease", "2", "unmap", "1", "hold", "memrelease", "0", "hold"],
        sim.job_env(region.path))
    c.until("hold")
    base = region.read_usage().devices[0].used
    c.go()
    for step in ("create", "map", "retain", "memrelease", "unmap"):
        assert c.until(step)[0] == "0", step
    c.until("hold")
    assert region.read_usage().devices[0].used == base + 256 * MiB == sim.process_used(c.pid)
    c.go()
    assert c.until("memrelease") == ["0"]
    c.until("hold")
    assert region.read_usage().devices[0].used == base == sim.process_used(c.pid)
    c.go()
    assert c.finish()[0] == 0
