"""What the ranks of a multi-GPU job ask of the driver, on two simulated GPUs,
through cuda-bindings: peer access (as the driver answers it, errors
included, on a machine whose GPUs reach each other and on one whose GPUs
don't), memory shared between processes through VMM shareable handles (on
the exporter's GPU, charged once, to the exporter), and host-located
cuMemCreate (NCCL's cuMem host buffers: not device memory)."""

from __future__ import annotations

import pytest
from support.sim import holding, run_py

MiB = 1 << 20

PEER = """
ck(cu.cuInit(0))
c0 = ck(cu.cuDevicePrimaryCtxRetain(0)); c1 = ck(cu.cuDevicePrimaryCtxRetain(1))
ck(cu.cuCtxSetCurrent(c0))
r = {"can01": ck(cu.cuDeviceCanAccessPeer(0, 1)), "can00": ck(cu.cuDeviceCanAccessPeer(0, 0)),
     "attr": ck(cu.cuDeviceGetP2PAttribute(
         cu.CUdevice_P2PAttribute.CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, 0, 1)),
     "self_attr": err(cu.cuDeviceGetP2PAttribute(
         cu.CUdevice_P2PAttribute.CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, 0, 0)),
     "enable": err(cu.cuCtxEnablePeerAccess(c1, 0)),
     "again": err(cu.cuCtxEnablePeerAccess(c1, 0)),
     "own": err(cu.cuCtxEnablePeerAccess(c0, 0)),
     "flags": err(cu.cuCtxEnablePeerAccess(c1, 1)),
     "disable": err(cu.cuCtxDisablePeerAccess(c1)),
     "disable_again": err(cu.cuCtxDisablePeerAccess(c1))}
# a copy between the GPUs works with or without peer access
a = ck(cu.cuMemAlloc(4096)); ck(cu.cuCtxSetCurrent(c1)); b = ck(cu.cuMemAlloc(4096))
src = (ctypes.c_uint8 * 16)(*range(16)); back = (ctypes.c_uint8 * 16)()
ck(cu.cuMemcpyHtoD(a, src, 16)); ck(cu.cuMemcpyPeer(b, c1, a, c0, 16))
ck(cu.cuMemcpyDtoH(back, b, 16))
r["copied"] = list(back) == list(src)
out(r)
"""


def test_gpus_reach_each_other_as_the_driver_says(sim_env):
    assert run_py(sim_env, PEER) == {
        "can01": 1, "can00": 0, "attr": 1, "self_attr": "CUDA_ERROR_INVALID_DEVICE",
        "enable": "CUDA_SUCCESS", "again": "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
        "own": "CUDA_ERROR_INVALID_DEVICE", "flags": "CUDA_ERROR_INVALID_VALUE",
        "disable": "CUDA_SUCCESS", "disable_again": "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
        "copied": True}


def test_a_machine_whose_gpus_cant_reach_each_other(sim_env):
    """VGPU_SIM_PEER=0: cuDeviceCanAccessPeer says no, and enabling peer
    access fails as the driver fails it; copies go through all the same."""
    out = run_py({**sim_env, "VGPU_SIM_PEER": "0"}, PEER)
    assert (out["can01"], out["attr"], out["enable"], out["copied"]) == (
        0, 0, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", True)


P2P_STATUS = """
import pynvml
pynvml.nvmlInit()
h = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
caps = {"read": 0, "write": 1, "nvlink": 2, "atomics": 3}    # NVML_P2P_CAPS_INDEX_*
# every pair, a GPU and itself included, as NCCL asks at its start
out({f"{a}{b}-{k}": pynvml.nvmlDeviceGetP2PStatus(h[a], h[b], v)
     for a in range(2) for b in range(2) for k, v in caps.items()})
"""


@pytest.mark.parametrize("peer", ["1", "0"])
def test_nvml_says_what_the_driver_says_of_peer_access(sim_env, peer):
    out = run_py({**sim_env, "VGPU_SIM_PEER": peer}, P2P_STATUS)
    ok = 0 if peer == "1" else 1        # NVML_P2P_STATUS_OK, _CHIPSET_NOT_SUPPORTED
    for pair in ("01", "10"):
        assert (out[f"{pair}-read"], out[f"{pair}-write"]) == (ok, ok)
        assert out[f"{pair}-nvlink"] == out[f"{pair}-atomics"] == 5    # NOT_SUPPORTED
    # a GPU and itself: answered, NOT_SUPPORTED (an H100's driver 580 says so)
    assert {out[f"{p}-{k}"] for p in ("00", "11") for k in ("read", "write", "nvlink")} == {5}


# Exports 4 MiB of device memory on the GPU CUDA_VISIBLE_DEVICES shows as
# device ORDINAL, written with bytes 0..15, as a POSIX fd.
EXPORT = """
ck(cu.cuInit(0))
ordinal = int(os.environ["ORDINAL"])
ctx = ck(cu.cuDevicePrimaryCtxRetain(ordinal)); ck(cu.cuCtxSetCurrent(ctx))
prop = cu.CUmemAllocationProp()
prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
prop.location.id = ordinal
prop.requestedHandleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
h = ck(cu.cuMemCreate(4 << 20, prop, 0))
va = ck(cu.cuMemAddressReserve(4 << 20, 0, 0, 0)); ck(cu.cuMemMap(va, 4 << 20, 0, h, 0))
src = (ctypes.c_uint8 * 16)(*range(16)); ck(cu.cuMemcpyHtoD(va, src, 16))
fd = ck(cu.cuMemExportToShareableHandle(
    h, cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0))
out({"fd": fd, "pid": os.getpid()})
"""

# Imports the holder's fd (through /proc, as a process given it over a Unix
# socket would hold it), maps it and reads it.
IMPORT = """
ck(cu.cuInit(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(0)); ck(cu.cuCtxSetCurrent(ctx))
fd = os.open(f"/proc/{os.environ['PEER_PID']}/fd/{os.environ['PEER_FD']}", os.O_RDWR)
T = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
r = cu.cuMemImportFromShareableHandle(fd, T)
if r[0] != cu.CUresult.CUDA_SUCCESS:
    out({"import": err(r)})
    raise SystemExit(0)
h = r[1]
prop = ck(cu.cuMemGetAllocationPropertiesFromHandle(h))
va = ck(cu.cuMemAddressReserve(4 << 20, 0, 0, 0)); ck(cu.cuMemMap(va, 4 << 20, 0, h, 0))
back = (ctypes.c_uint8 * 16)(); ck(cu.cuMemcpyDtoH(back, va, 16))
out({"import": "CUDA_SUCCESS", "type": int(prop.location.type), "id": prop.location.id,
     "bytes": list(back)})
"""


def test_memory_shared_through_a_shareable_handle_is_the_exporters(sim):
    """Exported on GPU 1, imported by a process that sees GPU 1 as device
    1 and by one that sees it as device 0: the same bytes, on GPU 1, charged
    once (to the exporter); a process that can't see GPU 1 can't import it,
    and an fd that is no allocation is refused."""
    s = sim
    with holding({**s.env, "ORDINAL": "1"}, EXPORT) as h:
        peer = {"PEER_PID": str(h.pid), "PEER_FD": str(h.report["fd"])}
        both = run_py({**s.env, **peer}, IMPORT)
        assert both == {"import": "CUDA_SUCCESS", "type": 1, "id": 1, "bytes": list(range(16))}
        assert run_py({**s.env, **peer, "CUDA_VISIBLE_DEVICES": "1"}, IMPORT)["id"] == 0
        assert run_py({**s.env, **peer, "CUDA_VISIBLE_DEVICES": "0"}, IMPORT) == {
            "import": "CUDA_ERROR_INVALID_DEVICE"}
        # while an importer holds it: charged to the exporter alone, once
        with holding({**s.env, **peer}, IMPORT) as imp:
            stats = s.stats()
            procs = {p["pid"]: [d["used"] for d in p["devices"]] for p in stats["processes"]}
            ctx = procs[imp.pid][0]                   # the importer's own context
            assert procs[imp.pid] == [ctx, 0]
            assert procs[h.pid][1] == ctx + 4 * MiB
            assert [d["used"] for d in stats["devices"]] == [ctx, ctx + 4 * MiB]
    bogus = sim.root / "bogus"
    bogus.write_bytes(b"\0" * (4 * MiB))
    with holding(s.env, f"fd = os.open({str(bogus)!r}, os.O_RDWR)\n"
                 "out({'fd': fd, 'pid': os.getpid()})\n") as h:
        peer = {"PEER_PID": str(h.pid), "PEER_FD": str(h.report["fd"])}
        assert run_py({**s.env, **peer}, IMPORT) == {"import": "CUDA_ERROR_INVALID_VALUE"}


@pytest.mark.parametrize("where", ["HOST", "HOST_NUMA", "HOST_NUMA_CURRENT"])
def test_host_located_cuMemCreate_is_not_device_memory(sim_env, where):
    out = run_py(sim_env, f"""
        ck(cu.cuInit(0))
        ctx = ck(cu.cuDevicePrimaryCtxRetain(0)); ck(cu.cuCtxSetCurrent(ctx))
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_{where}
        prop.location.id = 0
        free0, _ = ck(cu.cuMemGetInfo())
        h = ck(cu.cuMemCreate(8 << 20, prop, 0))
        free1, _ = ck(cu.cuMemGetInfo())
        va = ck(cu.cuMemAddressReserve(8 << 20, 0, 0, 0)); ck(cu.cuMemMap(va, 8 << 20, 0, h, 0))
        src = (ctypes.c_uint8 * 16)(*range(16)); back = (ctypes.c_uint8 * 16)()
        ck(cu.cuMemcpyHtoD(va, src, 16)); ck(cu.cuMemcpyDtoH(back, va, 16))
        # access by the device and by the host, as NCCL gives it
        acc = cu.CUmemAccessDesc()
        acc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        acc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        acc.location.id = 0
        ck(cu.cuMemSetAccess(va, 8 << 20, [acc], 1))
        acc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA
        ck(cu.cuMemSetAccess(va, 8 << 20, [acc], 1))
        acc.location.id = 3
        node3 = err(cu.cuMemSetAccess(va, 8 << 20, [acc], 1))
        ck(cu.cuMemUnmap(va, 8 << 20)); ck(cu.cuMemRelease(h))
        prop.location.id = 1
        other = err(cu.cuMemCreate(8 << 20, prop, 0))
        out({{"charged": free0 - free1, "copied": list(back) == list(src), "node1": other,
              "access3": node3}})
    """)
    assert out["charged"] == 0 and out["copied"]
    assert out["access3"] == "CUDA_ERROR_INVALID_VALUE"
    # the simulated host has one NUMA node
    assert out["node1"] == ("CUDA_ERROR_INVALID_VALUE" if where == "HOST_NUMA"
                            else "CUDA_SUCCESS")
