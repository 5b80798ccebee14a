"""The launch gate of libvgpu.so (issue 5, hook side): every launch path is
counted, and when the job's region throttles a GPU every path waits for
tokens from the bucket the daemon refills; only the launching thread waits,
and changes of the rate apply while it waits. No timing is asserted."""

from __future__ import annotations

import pytest
from support.hook import (
    TOKEN_SCALE,
    GiB,
    slot_of,
    wait_for,
)

# cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel, cuGraphLaunch (each
# also _ptsz), and the launches before cuLaunchKernel: cuLaunch, cuLaunchGrid,
# cuLaunchGridAsync (deprecated, still exported, found by cuGetProcAddress).
PATHS = ["kernel", "kernel_ptsz", "ex", "ex_ptsz", "coop", "coop_ptsz", "graph", "graph_ptsz",
         "legacy", "grid", "gridasync"]


@pytest.mark.parametrize("path", PATHS)
def test_unthrottled_launches_are_counted(path, sim, clients, client_factory):
    region = sim.region([GiB, GiB])
    c = client_factory(clients["gpa_v2"], ["ctx", "0", "launch", path, "5", "hold"],
                       sim.job_env(region.path))
    assert c.until("launch") == ["0"]
    c.until("hold")
    assert slot_of(region, c.pid).launches[0] == 5
    dev = region.read_usage().devices[0]
    assert dev.launches == 0 and dev.throttled_ns == 0   # the bucket was not touched


@pytest.mark.parametrize("path", PATHS)
def test_throttled_launch_path_waits_for_tokens(path, sim, clients, client_factory):
    """With no refill the launch cannot proceed; once the daemon gives a rate
    (live) it does, each launch having taken its tokens."""
    region = sim.region([GiB, GiB], throttle=True, refill_rate=0, bucket_size=2 * TOKEN_SCALE)
    c = client_factory(clients["direct"], ["ctx", "0", "launch", path, "3", "hold"],
                       sim.job_env(region.path))
    c.until("ctx")
    wait_for(lambda: region.read_usage().devices[0].throttled_ns > 0 or c.printed("launch"),
             what="the launch to wait")
    assert not c.printed("launch"), "a launch returned with no tokens to take"
    assert region.read_usage().devices[0].launches == 0
    region.update_device(0, refill_rate=1_000_000 * TOKEN_SCALE)
    assert c.until("launch") == ["0"]
    c.until("hold")
    dev = region.read_usage().devices[0]
    assert dev.launches == 3                 # launches that took tokens
    assert 0 <= dev.tokens <= 2 * TOKEN_SCALE
    assert slot_of(region, c.pid).launches[0] == 3


def test_lifting_the_throttle_releases_a_waiting_launch(sim, clients, client_factory):
    region = sim.region([GiB, GiB], throttle=True, refill_rate=0, bucket_size=TOKEN_SCALE)
    c = client_factory(clients["direct"], ["ctx", "0", "launch", "kernel", "2"],
                       sim.job_env(region.path))
    c.until("ctx")
    wait_for(lambda: region.read_usage().devices[0].throttled_ns > 0, what="the launch to wait")
    region.update_device(0, throttle=False)
    assert c.until("launch") == ["0"]
    # Counted in its process's slot, but not as a gated launch: the daemon
    # bounds those by the tokens its gate granted (vgpuctl.core.trust).
    assert region.read_usage().devices[0].launches == 0


def test_only_the_launching_thread_waits(sim, clients, client_factory):
    """A thread's launch waits for tokens while the other threads go on: the
    main thread's calls return, and its join waits for the launching thread."""
    region = sim.region([GiB, GiB], throttle=True, refill_rate=0, bucket_size=TOKEN_SCALE)
    c = client_factory(clients["direct"], ["ctx", "0", "bglaunch", "kernel", "2", "info",
                                           "alloc", "1M", "launch", "graph", "0", "join"],
                       sim.job_env(region.path))
    assert c.until("bglaunch") == ["0"]
    assert c.until("info")[0] == "0"        # the process goes on meanwhile
    assert c.until("alloc")[0] == "0"
    assert c.until("launch") == ["0"]
    wait_for(lambda: region.read_usage().devices[0].throttled_ns > 0 or c.printed("join"),
             what="the launch to wait")
    assert not c.printed("join"), "the launching thread finished with no tokens to take"
    region.update_device(0, refill_rate=1_000_000 * TOKEN_SCALE)
    assert c.until("join") == ["0"]
    assert region.read_usage().devices[0].launches == 2


@pytest.mark.parametrize("path", ["kernel", "grid"])
def test_a_slow_rate_still_lets_every_launch_through(path, sim, clients, client_factory):
    """A rate of 200 launches/s and a bucket of 2: 20 launches all complete,
    each paying its tokens."""
    region = sim.region([GiB, GiB], throttle=True, refill_rate=200 * TOKEN_SCALE,
                        bucket_size=2 * TOKEN_SCALE)
    c = client_factory(clients["dlsym"], ["ctx", "0", "launch", path, "20", "hold"],
                       sim.job_env(region.path))
    assert c.until("launch", timeout=60) == ["0"]
    c.until("hold")
    dev = region.read_usage().devices[0]
    assert dev.launches == 20 and dev.throttled_ns > 0
