"""The simulated GPU under a root daemon is the node's, as a real one is:
every user's job opens it (the state file mode 0666, whatever the umask,
as /dev/nvidia* are), and a job is told the daemon's state file by its path,
so it never opens a simulated GPU of its own (docs/simulator.md)."""

from __future__ import annotations

import os
import stat

from support.daemon import needs_native, wait_for
from support.hostile import start_job_as_nobody

from vgpuctl.system import native

pytestmark = needs_native

G = 1 << 30


def test_another_users_job_runs_on_a_root_daemons_simulated_gpu(daemon_factory):
    d = daemon_factory(gpus="1x16G")
    state = d.base / "sim-state"
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o666
    with d.client() as c:
        r = c.call("run", command=["true"], cwd="/", mem=G)
        c.call("exited", job=r["job"]["id"], code=0)
    assert r["env"]["VGPU_SIM_STATE"] == str(state)
    env = {k: v for k, v in d.env.items() if k not in ("LD_PRELOAD", "VGPU_SIM_STATE")}
    env["PATH"] = "/usr/bin:/bin"
    burn = str(native.burn_program())
    job = start_job_as_nobody(d.socket, [burn, "--kernel-us", "1000", "--seconds", "60"],
                              env, G, 30, hooked=True, name="theirs")

    def launched() -> bool:
        view = d.job(job["job"])
        return bool(view and view["per_gpu"] and view["per_gpu"][0]["gated_launches"])
    wait_for(launched, 30, "nobody's job to launch kernels on the GPU")
    assert d.job(job["job"])["user"] != "root"
