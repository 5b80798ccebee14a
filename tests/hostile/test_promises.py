"""Promises shared fairly among the users asking (docs/compute.md, "Idle
promises"): an idle job of another user that holds a promise of 99 % of a
GPU made every other user's `--core 5` fail for as long as it liked; a
promise of a job that has run nothing on its GPU for `promise_idle_s`
yields to a job that needs it, and one that runs keeps it."""

from __future__ import annotations

import time

import pytest
from support.daemon import needs_native, wait_for
from support.hostile import start_job_as_nobody

from vgpuctl.system import native

pytestmark = needs_native

G = 1 << 30
IDLE_S = 2


def _env(d) -> dict[str, str]:
    env = {k: v for k, v in d.env.items() if k != "LD_PRELOAD"}
    env["PATH"] = "/usr/bin:/bin"
    return env


@pytest.mark.parametrize("runs", [False, True], ids=["idle", "running"])
def test_an_idle_promise_yields_to_another_users_need(daemon_factory, runs):
    d = daemon_factory(gpus="1x16G", config=f"promise_idle_s = {IDLE_S}\n")
    burn = str(native.burn_program())
    argv = [burn, "--kernel-us", "1000", "--seconds", "120"] if runs else ["sleep", "120"]
    theirs = start_job_as_nobody(d.socket, argv, _env(d), G, 99, hooked=True)
    t0 = time.monotonic()
    ask = ["run", "--mem", "1G", "--core", "5", "--name", "mine", "--", "true"]
    res = d.cli(*ask)
    assert res.returncode == 6 and "of its compute unpromised" in res.stderr, res
    wait_for(lambda: time.monotonic() - t0 > IDLE_S + 0.5, 10, "promise_idle_s to pass")
    res = d.cli(*ask)
    view = d.job(theirs["job"])
    if runs:        # it runs: its promise stands
        assert res.returncode == 6, res
        assert (view["promised"], view["core"]) == (True, 99)
    else:
        assert res.returncode == 0, res
        assert f"job {theirs['job']} of nobody gave up its promised share" in res.stderr
        assert (view["promised"], view["core"]) == (False, 100)
        assert "gave up its promised share, idle for" in d.log.read_text()
    d.cleanup_jobs()


def test_the_next_room_goes_to_the_user_who_has_asked_the_longest(daemon_factory):
    """Two users asking every 20 ms took every admission from a third: when
    room returns it goes to the user refused for want of it first who still
    asks (within 2 s), not to whoever asks fastest."""
    from pathlib import Path

    from support.hostile import in_child_as_nobody

    from vgpuctl.client.connection import Client

    d = daemon_factory(gpus="1x16G")

    def ask_as_nobody() -> dict:
        def go():
            with Client.connect(Path(d.socket)) as cl:
                try:
                    return cl.call("run", command=["true"], cwd="/", mem=8 * G)["job"]
                except Exception as e:
                    return {"error": str(e)}
        return in_child_as_nobody(go)

    with d.client() as c:
        big = c.call("run", command=["true"], cwd="/", mem=15 * G)["job"]
    refused = ask_as_nobody()
    assert "no room for 8G" in refused.get("error", ""), refused
    d.call("exited", job=big["id"], code=0)
    wait_for(lambda: not d.jobs(), 10, "the room to return")
    res = d.cli("run", "--mem", "8G", "--", "true")
    assert res.returncode == 6 and "the room is kept for user nobody" in res.stderr, res
    mine = ask_as_nobody()
    assert mine.get("user") == "nobody", mine
    # the rest of the room is anyone's
    assert d.cli("run", "--mem", "7G", "--", "true").returncode == 0
