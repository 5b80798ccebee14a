"""The memory limit of libvgpu.so (issue 3): every allocating entry point and
its free, counted as the driver reserves; contexts measured; exactly
CUDA_ERROR_OUT_OF_MEMORY over the limit with nothing leaked; the job's view of
memory; dead processes; CUDA_VISIBLE_DEVICES; configuration failures."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import pytest
from support.hook import (
    CUDA_ERROR_DEVICE_UNAVAILABLE,
    CUDA_ERROR_OUT_OF_MEMORY,
    GiB,
    MiB,
    make_sim,
    results,
    run,
    slot_of,
    wait_for,
)
from support.sim import run_py

from vgpuctl.system.structs import const

# name: (allocation, its free, what the driver reserves, an allocation over 1 GiB)
ENTRY_POINTS = {
    "cuMemAlloc_v2": (["alloc", "3M"], ["free", "0"], 4 * MiB, ["alloc", "2G"]),
    "cuMemAllocManaged": (["managed", "3M"], ["free", "0"], 4 * MiB, ["managed", "2G"]),
    "cuMemAllocPitch_v2": (["pitch", "1000", "3000"], ["free", "0"], 4 * MiB,
                           ["pitch", "65536", "32768"]),
    # a pool gives its freed reserve back at the next synchronisation
    "cuMemAllocAsync": (["async", "3M"], ["freeasync", "0", "sync"], 4 * MiB, ["async", "2G"]),
    "cuMemAllocAsync_ptsz": (["async_ptsz", "3M"], ["freeasync_ptsz", "0", "sync"], 4 * MiB,
                             ["async_ptsz", "2G"]),
    "cuMemAllocFromPoolAsync": (["pool", "3M"], ["freeasync", "0", "sync"], 4 * MiB,
                                ["pool", "2G"]),
    "cuMemAllocFromPoolAsync_ptsz": (["pool_ptsz", "3M"], ["freeasync_ptsz", "0", "sync"],
                                     4 * MiB, ["pool_ptsz", "2G"]),
    "cuMemCreate": (["create", "6M"], ["memrelease", "0"], 6 * MiB, ["create", "2G"]),
    "cuArrayCreate_v2": (["array", "1000", "1000"], ["destroy", "0"], 4 * MiB,
                         ["array", "32768", "16384"]),
    "cuArray3DCreate_v2": (["array3d", "64", "64", "300"], ["destroy", "0"], 20 * MiB,
                           ["array3d", "1024", "1024", "128"]),
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_entry_point_counts_what_the_driver_reserves(entry, sim, clients, client_factory):
    alloc, free, reserved, huge = ENTRY_POINTS[entry]
    region = sim.region([GiB, GiB])
    c = client_factory(clients["direct"], ["ctx", "0", "hold", *alloc, "hold", *free, "hold",
                                           *huge, "hold"], sim.job_env(region.path))

    def used():
        return region.read_usage().devices[0].used

    c.until("hold")
    base = used()
    assert base > 0 and base == sim.process_used(c.pid)   # the context, measured
    c.go()
    assert c.until(alloc[0])[0] == "0"
    c.until("hold")
    assert used() == base + reserved == sim.process_used(c.pid)
    assert slot_of(region, c.pid).allocs >= 1
    c.go()
    assert c.until(free[0]) == ["0"]
    c.until("hold")
    assert used() == base == sim.process_used(c.pid)
    c.go()
    assert c.until(huge[0])[0] == str(CUDA_ERROR_OUT_OF_MEMORY)
    c.until("hold")
    assert used() == base == sim.process_used(c.pid)      # nothing leaked
    assert region.read_usage().devices[0].oom_refusals == 1
    c.go()
    assert c.finish()[0] == 0


def test_context_memory_is_measured_not_guessed(tmp_path, clients, client_factory):
    """The hook counts what NVML reports for the process's context, whatever
    it is, and gives it back (with what was allocated in it) when the
    context goes."""
    sim = make_sim(tmp_path, VGPU_SIM_CTX_MEM="100M")
    region = sim.region([GiB, GiB])
    c = client_factory(clients["direct"],
                       ["ctx", "0", "hold", "newctx", "0", "alloc", "10M", "hold", "dropctx",
                        "hold", "release", "0", "hold"], sim.job_env(region.path))
    c.until("hold")
    slot = slot_of(region, c.pid)
    assert slot.ctx_bytes[0] == 100 * MiB == slot.used[0]
    c.go()
    c.until("hold")
    slot = slot_of(region, c.pid)
    assert slot.ctx_bytes[0] == 200 * MiB and slot.used[0] == 210 * MiB
    assert sim.process_used(c.pid) == 210 * MiB
    c.go()
    assert c.until("dropctx") == ["0"]
    c.until("hold")
    assert slot_of(region, c.pid).used[0] == 100 * MiB == sim.process_used(c.pid)
    c.go()
    assert c.until("release") == ["0"]
    c.until("hold")
    assert slot_of(region, c.pid).used[0] == 0 == region.read_usage().devices[0].used
    c.go()
    c.finish()


@pytest.mark.parametrize("reset", ["reset", "reset_v2"])
def test_a_reset_gives_back_the_primary_context_and_its_memory(reset, tmp_path, clients,
                                                              client_factory):
    """cuDevicePrimaryCtxReset (and _v2) destroys the primary context and
    everything allocated in it: the job's count and cuMemGetInfo show neither
    any more. A retain after it makes the context anew (counted once), and
    the releases still owed for the retain before the reset are harmless."""
    sim = make_sim(tmp_path, VGPU_SIM_CTX_MEM="100M")
    region = sim.region([GiB, GiB])
    c = client_factory(clients["direct"],
                       ["ctx", "0", "alloc", "64M", "hold", reset, "0", "hold", "ctx", "0",
                        "info", "hold", "release", "0", "release", "0", "hold"],
                       sim.job_env(region.path))

    def used() -> int:
        return region.read_usage().devices[0].used

    c.until("hold")
    assert used() == 164 * MiB == sim.process_used(c.pid)
    c.go()
    assert c.until(reset) == ["0"]
    c.until("hold")
    slot = slot_of(region, c.pid)
    assert used() == 0 == slot.used[0] == slot.ctx_bytes[0] == sim.process_used(c.pid)
    c.go()
    assert c.until("ctx") == ["0"]
    assert c.until("info") == ["0", str(GiB - 100 * MiB), str(GiB)]
    c.until("hold")
    assert used() == 100 * MiB == sim.process_used(c.pid)
    c.go()
    assert [c.until("release"), c.until("release")] == [["0"], ["0"]]
    c.until("hold")
    assert used() == 0 == sim.process_used(c.pid)
    c.go()
    c.finish()


@pytest.mark.parametrize("mode", ["direct", "gpa_v2"])
@pytest.mark.parametrize("create", ["newctx3", "newctx4"])
def test_contexts_of_every_cuCtxCreate_version_are_counted(create, mode, tmp_path, clients,
                                                           client_factory):
    """cuCtxCreate_v3 (CUDA 11.4) and _v4 (12.5, what cuGetProcAddress gives a
    CUDA 12.5+ caller for cuCtxCreate) cost the job their memory as _v2 does,
    and give it back, with what was allocated in them, when destroyed."""
    sim = make_sim(tmp_path, VGPU_SIM_CTX_MEM="100M")
    region = sim.region([GiB, GiB])
    c = client_factory(clients[mode], ["ctx", "0", create, "0", "alloc", "10M", "hold",
                                       "dropctx", "hold"], sim.job_env(region.path))
    assert c.until(create) == ["0"]
    c.until("hold")
    slot = slot_of(region, c.pid)
    assert slot.ctx_bytes[0] == 200 * MiB and slot.used[0] == 210 * MiB
    assert region.read_usage().devices[0].used == 210 * MiB == sim.process_used(c.pid)
    c.go()
    assert c.until("dropctx") == ["0"]
    c.until("hold")
    slot = slot_of(region, c.pid)
    assert slot.ctx_bytes[0] == 100 * MiB == slot.used[0] == sim.process_used(c.pid)
    c.go()
    c.finish()


@pytest.mark.parametrize("create", ["newctx3", "newctx4"])
def test_a_created_context_that_does_not_fit_is_refused(create, tmp_path, clients,
                                                       client_factory):
    """A limit too small for one more context: cuCtxCreate_v3/_v4 fail with
    CUDA_ERROR_OUT_OF_MEMORY, and the context the driver made is gone again."""
    sim = make_sim(tmp_path, VGPU_SIM_CTX_MEM="100M")
    region = sim.region([150 * MiB, 150 * MiB])
    c = client_factory(clients["direct"], ["ctx", "0", create, "0", "info", "hold"],
                       sim.job_env(region.path))
    assert c.until(create) == [str(CUDA_ERROR_OUT_OF_MEMORY)]
    # the primary context is the current one again, and the only one counted
    assert c.until("info") == ["0", str(50 * MiB), str(150 * MiB)]
    c.until("hold")
    usage = region.read_usage()
    assert usage.devices[0].used == 100 * MiB == sim.process_used(c.pid)
    assert usage.devices[0].oom_refusals == 1
    c.go()
    c.finish()


def test_context_that_does_not_fit_is_refused(sim, clients):
    region = sim.region([256 * MiB, 256 * MiB])   # a context costs 300 MiB here
    res = run(clients["direct"], ["ctx", "0", "info"], sim.job_env(region.path))
    assert results(res.stdout, "ctx") == [[str(CUDA_ERROR_OUT_OF_MEMORY)]]
    usage = region.read_usage()
    assert usage.devices[0].used == 0 and usage.devices[0].oom_refusals == 1
    assert all(p["devices"][0]["used"] == 0 for p in sim.stats()["processes"])


def test_memory_info_is_the_job_view_and_saturates(sim, clients, client_factory):
    region = sim.region([GiB, GiB])
    c = client_factory(clients["direct"], ["ctx", "0", "alloc", "512M", "info", "total", "0",
                                           "hold", "info", "total", "0"],
                       sim.job_env(region.path))
    c.until("alloc")
    rc, free, total = c.until("info")
    used = region.read_usage().devices[0].used
    assert (int(free), int(total)) == (GiB - used, GiB)
    assert c.until("total") == ["0", str(GiB)]
    c.until("hold")
    region.update_device(0, mem_limit=256 * MiB)   # the daemon lowers the limit live
    c.go()
    rc, free, total = c.until("info")
    assert (rc, int(free), int(total)) == ("0", 0, 256 * MiB)   # not 2**64 - something
    assert c.until("total") == ["0", str(256 * MiB)]
    c.finish()


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "zombie"])
def test_killed_process_memory_leaves_the_job(reaped, tmp_path, clients, client_factory):
    """A SIGKILLed process's memory is out of the job's count before the next
    allocation could be refused for it, whether or not it was reaped."""
    sim = make_sim(tmp_path, VGPU_SIM_CTX_MEM="100M")
    region = sim.region([GiB, GiB])
    env = sim.job_env(region.path)
    a = client_factory(clients["direct"], ["ctx", "0", "alloc", "800M", "hold"], env)
    assert a.until("alloc")[0] == "0"
    a.until("hold")
    assert region.read_usage().devices[0].used == 900 * MiB
    if reaped:
        a.kill()
    else:
        os.kill(a.pid, signal.SIGKILL)
        wait_for(lambda: Path(f"/proc/{a.pid}/stat").read_text().split(")")[1].split()[0] == "Z",
                 what="the zombie")
    res = run(clients["direct"], ["ctx", "0", "alloc", "800M"], env)
    assert results(res.stdout, "ctx") == [["0"]]
    assert results(res.stdout, "alloc")[0][0] == "0", res.stderr
    assert region.read_usage().devices[0].oom_refusals == 0


def test_cuda_visible_devices_maps_to_the_right_limit(sim, clients):
    """Ordinals are the driver's (after CUDA_VISIBLE_DEVICES, by index or
    UUID); the limit is the physical GPU's."""
    region = sim.region({1: 1 * GiB, 0: 2 * GiB})

    def total(cvd: str, ordinal: int = 0) -> int:
        env = sim.job_env(region.path, CUDA_VISIBLE_DEVICES=cvd)
        res = run(clients["direct"], ["ctx", str(ordinal), "info"], env)
        rc, free, tot = results(res.stdout, "info")[0]
        assert rc == "0", res.stderr
        return int(tot)

    assert total("1") == 1 * GiB
    assert total("0") == 2 * GiB
    assert total(sim.uuids[1]) == 1 * GiB
    assert total(sim.uuids[0]) == 2 * GiB
    assert total("1,0", 1) == 2 * GiB
    assert total(f"{sim.uuids[0]},{sim.uuids[1]}", 1) == 1 * GiB
    env = sim.job_env(region.path, CUDA_VISIBLE_DEVICES="1")
    res = run(clients["direct"], ["ctx", "0", "alloc", "1500M"], env)
    assert results(res.stdout, "alloc")[0][0] == str(CUDA_ERROR_OUT_OF_MEMORY)


def _broken_region(kind: str, sim) -> dict[str, str]:
    if kind == "missing":
        return sim.job_env(sim.root / "no-such-region")
    if kind == "bad-limit-value":
        return sim.job_env(None, VGPU_MEM_LIMIT="lots")
    region = sim.region([GiB, GiB])
    if kind == "wrong-job":
        return sim.job_env(region.path, VGPU_JOB="someone-else")
    if kind == "garbage-file":
        (region.path / "region").write_text("garbage\n")
        return sim.job_env(region.path)
    if kind == "garbage":
        region.limits.magic = 0x21656761
    else:   # a layout version this hook does not read
        region.limits.version = 99
    return sim.job_env(region.path)


@pytest.mark.parametrize("kind", ["missing", "garbage", "garbage-file", "version",
                                  "wrong-job", "bad-limit-value"])
def test_unusable_configuration_fails_calls_with_one_line(kind, sim, clients):
    """A process given a limit never runs unlimited: CUDA calls fail and one
    line on stderr says why."""
    env = _broken_region(kind, sim)
    res = run(clients["gpa_v2"], ["init", "ctx", "0", "alloc", "1M", "info", "init"], env)
    assert res.returncode == 0
    for cmd in ("init", "ctx", "alloc", "info"):
        assert all(r[0] == str(CUDA_ERROR_DEVICE_UNAVAILABLE) for r in results(res.stdout, cmd))
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vgpu: "), res.stderr


def test_a_job_full_of_live_processes_refuses_one_more(sim, clients, client_factory):
    """All 128 process slots of a job held by live processes: the next
    process's CUDA calls fail with CUDA_ERROR_DEVICE_UNAVAILABLE, with one
    line saying why. A slot comes free when its process is killed (the next
    claim sweeps it) or exits (it gives its slot back), and a new process
    takes it."""
    region = sim.region([GiB, GiB])
    env = sim.job_env(region.path)
    slots = const("VGPU_MAX_PROCS")
    holders = [client_factory(clients["direct"], ["init", "hold"], env) for _ in range(slots)]
    for h in holders:
        assert h.until("init", timeout=60) == ["0"]

    def live_slots() -> int:
        return sum(1 for p in region.read_usage().procs if p.pid > 0)

    assert live_slots() == slots
    res = run(clients["direct"], ["init", "ctx", "0", "alloc", "1M", "info"], env)
    for cmd in ("init", "ctx", "alloc", "info"):
        assert results(res.stdout, cmd)[0][0] == str(CUDA_ERROR_DEVICE_UNAVAILABLE), res.stdout
    assert res.stderr.splitlines() == [
        f"vgpu: no free process slot in the job's region ({slots} processes at most); "
        "CUDA calls fail"]
    holders[0].kill()                       # SIGKILL: its slot is swept
    res = run(clients["direct"], ["ctx", "0", "alloc", "1M"], env)
    assert results(res.stdout, "alloc")[0][0] == "0", res.stderr
    assert live_slots() == slots - 1        # and given back at its exit
    holders[1].go()                         # an exit gives the slot back
    assert holders[1].finish()[0] == 0
    assert live_slots() == slots - 2
    res = run(clients["direct"], ["ctx", "0", "alloc", "1M"], env)
    assert results(res.stdout, "alloc")[0][0] == "0", res.stderr


def test_private_limit_without_a_daemon(sim, clients):
    """VGPU_MEM_LIMIT alone: the limit on every GPU, for this process."""
    env = sim.job_env(None, VGPU_MEM_LIMIT="1G")
    res = run(clients["direct"], ["ctx", "1", "info", "alloc", "512M", "alloc", "600M", "ctx",
                                  "0", "info"], env)
    infos = results(res.stdout, "info")
    assert [int(i[2]) for i in infos] == [GiB, GiB]
    assert [a[0] for a in results(res.stdout, "alloc")] == ["0", str(CUDA_ERROR_OUT_OF_MEMORY)]


def test_a_refusal_is_said_once_per_process_by_default(sim, clients):
    """A user who gets CUDA_ERROR_OUT_OF_MEMORY at half the GPU hears why:
    one warning, with the limit and what the job holds (its context
    included), however many allocations are refused."""
    env = sim.job_env(None, VGPU_MEM_LIMIT="1G")
    env.pop("VGPU_LOG_LEVEL", None)
    res = run(clients["direct"], ["ctx", "0", "alloc", "512M", "alloc", "600M", "alloc", "700M",
                                  "async", "2G"], env)
    codes = [a[0] for a in results(res.stdout, "alloc") + results(res.stdout, "async")]
    assert codes == ["0", *[str(CUDA_ERROR_OUT_OF_MEMORY)] * 3]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("vgpu: cuMemAlloc_v2 of 600M refused (CUDA_ERROR_OUT_OF_MEMORY)")
    assert "of its 1G limit" in lines[0] and "contexts included" in lines[0]
    held = int(lines[0].split("the job holds ")[1].split("M of")[0].split(".")[0])
    assert 512 < held < 1024           # the 512M, and the context
    quiet = run(clients["direct"], ["ctx", "0", "alloc", "2G"],
                {**env, "VGPU_LOG_LEVEL": "error"})
    assert results(quiet.stdout, "alloc")[0][0] == str(CUDA_ERROR_OUT_OF_MEMORY)
    assert quiet.stderr == ""


def test_no_configuration_passes_through(sim, clients):
    res = run(clients["gpa_v2"], ["ctx", "0", "info", "alloc", "2G"], sim.job_env(None))
    assert int(results(res.stdout, "info")[0][2]) == 16 * GiB
    assert results(res.stdout, "alloc")[0][0] == "0"
    assert res.stderr == ""


def _segments(pid: int) -> dict[int, str]:
    """The System V segments a process has attached: shmid -> permissions
    (/proc/PID/maps names them /SYSV<key>, their inode the shmid)."""
    out = {}
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[5].startswith("/SYSV"):
            out[int(parts[4])] = parts[1]
    return out


def test_hook_attaches_limits_read_only_and_no_file(sim, clients, client_factory):
    region = sim.region([GiB, GiB])
    c = client_factory(clients["direct"], ["ctx", "0", "hold"], sim.job_env(region.path))
    c.until("hold")
    seg = _segments(c.pid)
    assert seg[region.limits_id] == "r--s"
    assert seg[region.usage_id] == "rw-s"
    # Nothing of the region is a file the process maps.
    maps = Path(f"/proc/{c.pid}/maps").read_text()
    assert str(region.path) not in maps
    assert sorted(p.name for p in region.path.iterdir()) == ["region"]
    assert (region.path / "region").stat().st_mode & 0o777 == 0o644


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_job_user_cannot_write_its_limits():
    """The region of a job run as another user: that user can attach the
    usage segment read-write (the hook must) but not the limits, and can't
    write any file of the region."""
    nobody = 65534
    top = Path(tempfile.mkdtemp(prefix="vgpu-perm-"))
    region = None
    try:
        os.chmod(top, 0o755)
        from vgpuctl.system.limits import DeviceLimit
        from vgpuctl.system.region import Region
        region = Region.create(top / "job", "job-perm", nobody,
                               [DeviceLimit(uuid="GPU-00000000-0000-0000-0000-000000000000",
                                            mem_limit=GiB)])
        os.chmod(top / "job", 0o755)

        def attempt(how) -> int:
            """0: done, 1: denied, 2: anything else."""
            pid = os.fork()
            if pid == 0:   # the child becomes the job's user and tries
                try:
                    os.setgid(nobody)
                    os.setuid(nobody)
                    how()
                    os._exit(0)
                except PermissionError:
                    os._exit(1)
                except BaseException:
                    os._exit(2)
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

        from vgpuctl.system.shm import shm_attach
        assert attempt(lambda: shm_attach(region.limits_id, writable=True)) == 1
        assert attempt(lambda: shm_attach(region.limits_id, writable=False)) == 0
        assert attempt(lambda: shm_attach(region.usage_id, writable=True)) == 0
        assert attempt(lambda: open(top / "job" / "region", "r+b").close()) == 1
        assert attempt(lambda: open(top / "job" / "usage", "wb").close()) == 1
    finally:
        if region is not None:
            region.remove()
        shutil.rmtree(top, ignore_errors=True)


FORK = """
import os, sys
import pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
n.nvmlDeviceGetMemoryInfo(h)            # through the hook: this process has its slot
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    n.nvmlDeviceGetMemoryInfo(h)        # the child is a process of the job of its own
    os.write(w, b"x")
    os.read(0, 1)
    os._exit(0)
os.read(r, 1)
print("pids", os.getpid(), pid, flush=True)
sys.stdin.read(1)
"""


def test_forked_child_is_a_process_of_its_own(sim, client_factory):
    region = sim.region([GiB, GiB])
    script = sim.root / "fork.py"
    script.write_text(FORK)
    c = client_factory(Path(sys.executable), [str(script)], sim.job_env(region.path))
    parent, child = map(int, c.until("pids"))
    slots = {p.pid for p in region.read_usage().procs}
    assert {parent, child} <= slots


# A pool that keeps what it frees (PyTorch's cudaMallocAsync backend sets
# the threshold so): 1 GiB allocated from it and freed stays the job's.
POOL_RESERVE = """
ck(cu.cuInit(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(0)); ck(cu.cuCtxSetCurrent(ctx))
pool = ck(cu.cuDeviceGetDefaultMemPool(0))
A = cu.CUmemPool_attribute
ck(cu.cuMemPoolSetAttribute(pool, A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, cu.cuuint64_t(2**64 - 1)))
s = cu.CUstream(0)
p = ck(cu.cuMemAllocFromPoolAsync(1 << 30, pool, s))
ck(cu.cuMemFreeAsync(p, s)); ck(cu.cuCtxSynchronize())
res = {"elsewhere": err(cu.cuMemAlloc(1 << 30))}
r = cu.cuMemAllocFromPoolAsync(1 << 30, pool, s)
res["from_reserve"] = err(r)
if r[1]:
    ck(cu.cuMemFreeAsync(r[1], s)); ck(cu.cuCtxSynchronize())
ck(cu.cuMemPoolTrimTo(pool, 0))
r = cu.cuMemAlloc(1 << 30)
res["after_trim"] = err(r)
out(res)
"""


def test_a_pools_reserve_counts_against_the_limit(sim):
    """Freed pool memory the pool keeps is still the job's: another 1 GiB
    does not fit a 2 GiB limit beside it (the device would hold 2.3 GiB for
    the job), the pool's own reserve serves a new allocation, and a trim
    gives it back. The simulator's record of the job never passes 2 GiB."""
    region = sim.region([2 * GiB, 2 * GiB])
    env = sim.job_env(region.path, VGPU_SIM_TAG="pool-job")
    res = run_py(env, POOL_RESERVE)
    assert res == {"elsewhere": "CUDA_ERROR_OUT_OF_MEMORY", "from_reserve": "CUDA_SUCCESS",
                   "after_trim": "CUDA_SUCCESS"}
    tag = next(t for t in sim.stats()["tags"] if t["name"] == "pool-job")
    assert tag["devices"][0]["peak"] <= 2 * GiB
