"""`vgpuctl slurm ...` as Slurm runs its hooks, against a real daemon but no
Slurm (tests/slurm has the cluster): the TaskProlog's export lines and its
fail-closed exits, the Epilog's release, gres.conf from the daemon."""

from __future__ import annotations

import os
import subprocess

import pytest
from support.daemon import needs_native, read_line, vgpuctl_argv

pytestmark = needs_native

SLURM_CONFIG = '[slurm]\nshard_size = "1G"\n'


@pytest.fixture
def node(daemon_factory):
    d = daemon_factory(config=SLURM_CONFIG)
    d.call("slurm_register", slurm_job="5", uid=os.getuid(), gpus=[1], shards=3)
    return d


def hook_popen(daemon, name, **env):
    """Start a hook as slurmstepd does a TaskProlog: as the child of the task
    (here a shell, which the task-prolog attaches as the job's; never this
    test's process, which the daemon fixture would then kill at teardown)."""
    argv = [*vgpuctl_argv(), "slurm", name]
    return subprocess.Popen(["sh", "-c", '"$@"; exit $?', "sh", *argv],
                            env={**daemon.env, "SLURM_JOB_ID": "5", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def hook(daemon, name, **env):
    """Run a hook as a TaskProlog runs (hook_popen) to its end."""
    with hook_popen(daemon, name, **env) as p:
        out, err = p.communicate(timeout=60)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def test_the_task_prolog_prints_the_jobs_exports(node):
    r = hook(node, "task-prolog", SLURM_SHARDS_ON_NODE="3", LD_PRELOAD="libm.so.6")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    exports = dict(line.removeprefix("export ").split("=", 1) for line in r.stdout.splitlines())
    job = node.jobs()[0]
    assert exports["VGPU_JOB"] == job["id"] and exports["VGPU_REGION"].endswith("/" + job["id"])
    assert exports["CUDA_VISIBLE_DEVICES"] == job["gpu_uuid"]
    hook_lib, mine = exports["LD_PRELOAD"].split(":")
    assert hook_lib.endswith("libvgpu.so") and mine == "libm.so.6"
    assert (job["mem_limit"], job["slurm_shards"]) == (3 << 30, 3)


def test_a_task_with_shards_of_an_unregistered_job_fails_with_one_line(node):
    r = hook(node, "task-prolog", SLURM_JOB_ID="6", SLURM_SHARDS_ON_NODE="2")
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("vgpuctl: error: Slurm job 6 has")
    assert "not run unfenced" in r.stderr
    # The same line through Slurm's `print`, for the task's output.
    assert r.stdout == "print " + r.stderr


def test_a_task_with_shards_and_no_daemon_fails_and_one_without_is_untouched(node):
    gone = {"VGPU_SOCKET": str(node.base / "nobody-here.sock"), "VGPU_DAEMON_WAIT": "1"}
    r = hook(node, "task-prolog", SLURM_SHARDS_ON_NODE="3", **gone)
    assert r.returncode == 3 and "not run unfenced" in r.stderr, r.stderr
    assert "waited 1 s" in r.stderr and r.stdout.startswith("print vgpuctl: error:")
    for env in (gone, {"SLURM_JOB_ID": "6"}):
        r = hook(node, "task-prolog", **env)
        assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_a_task_prolog_waits_for_a_restarting_daemon(node):
    node.stop()
    with hook_popen(node, "task-prolog", SLURM_SHARDS_ON_NODE="3",
                    VGPU_DAEMON_WAIT="60") as p:
        assert "waiting up to 60 s" in read_line(p.stderr)
        node.start()                      # the registration outlives the restart
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "export VGPU_REGION=" in out and node.jobs()[0]["slurm_job"] == "5"


def test_the_epilog_releases_the_job(node):
    r = hook(node, "epilog")
    assert (r.returncode, r.stderr) == (0, "")
    assert node.jobs() == []
    assert node.jobs(all_jobs=True)[-1]["slurm_job"] == "5"


def test_the_hooks_need_slurms_environment(node):
    for name in ("prolog", "task-prolog", "epilog"):
        r = node.cli("slurm", name)
        assert r.returncode == 2, r.stderr
        assert r.stderr == ("vgpuctl: error: SLURM_JOB_ID is not set: run this as Slurm's "
                            "Prolog, TaskProlog or Epilog\n")


def test_the_prolog_leaves_a_job_without_gpus_alone(node):
    r = hook(node, "prolog", SLURM_JOB_ID="7", SLURM_JOB_UID="0")
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert [j["slurm_job"] for j in node.jobs()] == ["5"]


def test_gres_conf_gives_each_gpu_the_shards_its_capacity_holds(node):
    r = node.cli("slurm", "gres-conf")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "Name=shard Count=15 File=/dev/nvidia0 Flags=nvidia_gpu_env" in lines  # 16G - 512M
    assert "Name=shard Count=15 File=/dev/nvidia1 Flags=nvidia_gpu_env" in lines
    assert lines[-1].endswith("Gres=gpu:2,shard:30")
    r = node.cli("slurm", "gres-conf", "--shard-size", "2G")
    assert "Name=shard Count=7 File=/dev/nvidia0" in r.stdout
    assert r.stderr.startswith("vgpuctl: warning: the daemon's shard size is 1G")


def test_gres_conf_names_mig_devices_by_their_compute_instances_capability(
        daemon_factory, tmp_path):
    """GPU 0 of two simulated 80G GPUs in MIG mode (NVML's minor of a GPU
    is its index here): its MIG devices by slice, then GPU 1."""
    d = daemon_factory(gpus="2x80G", config='reserve = 0\n' + SLURM_CONFIG, start=False)
    d.env["VGPU_SIM_MIG"] = "0=3g.40gb@4,1g.10gb@0"
    d.start()
    gpus = {g["mig"]: g for g in d.call("ps")["gpus"]}
    small, big = gpus["1g.10gb"], gpus["3g.40gb"]
    minors = tmp_path / "mig-minors"
    minors.write_text("".join(f"gpu0/gi{g['gi']}/access {10 * g['gi']}\n"
                              f"gpu0/gi{g['gi']}/ci{g['ci']}/access {10 * g['gi'] + 1}\n"
                              for g in (small, big)))
    r = d.cli("slurm", "gres-conf", "--type", "h100", "--mig-minors", str(minors))
    assert r.returncode == 0, r.stderr
    lines = [ln.split("  #")[0] for ln in r.stdout.splitlines() if not ln.startswith("#")]
    cap = "File=/dev/nvidia-caps/nvidia-cap"
    assert lines[1:] == [
        f"Name=gpu Type=h100_1g.10gb {cap}{10 * small['gi'] + 1} Flags=nvidia_gpu_env",
        f"Name=gpu Type=h100_3g.40gb {cap}{10 * big['gi'] + 1} Flags=nvidia_gpu_env",
        "Name=gpu Type=h100 File=/dev/nvidia1 Flags=nvidia_gpu_env",
        f"Name=shard Count=10 {cap}{10 * small['gi'] + 1} Flags=nvidia_gpu_env",
        f"Name=shard Count=40 {cap}{10 * big['gi'] + 1} Flags=nvidia_gpu_env",
        "Name=shard Count=80 File=/dev/nvidia1 Flags=nvidia_gpu_env"]
    r = d.cli("slurm", "gres-conf", "--mig-minors", str(tmp_path / "none"))
    assert (r.returncode, r.stdout) == (2, ""), r
    assert r.stderr == (f"vgpuctl: error: {tmp_path / 'none'}: No such file or directory: "
                        "this node's MIG devices' gres lines name their nvidia-caps files by "
                        "the driver's minors (give --mig-minors FILE)\n")


def test_build_spank_without_slurms_headers_says_what_to_install(daemon_factory, tmp_path):
    d = daemon_factory(start=False)
    cc = tmp_path / "cc"          # a compiler that finds no spank.h, as gcc says it
    cc.write_text("#!/bin/sh\necho 'spank_vgpu.c:17:10: fatal error: slurm/spank.h: "
                  "No such file or directory' >&2\nexit 1\n")
    cc.chmod(0o755)
    r = d.cli("slurm", "build-spank", "--cc", str(cc), "-o", str(tmp_path / "p.so"))
    assert r.returncode == 9
    assert r.stderr == ("vgpuctl: error: slurm/spank.h not found: install Slurm's headers "
                        "(Debian: libslurm-dev) or give --include DIR\n")
    assert list(tmp_path.iterdir()) == [cc]


def test_the_prolog_registers_a_job_whose_name_holds_control_characters(node, tmp_path):
    """A Slurm job's name is its user's to choose: the daemon refuses control
    characters in names, so the Prolog writes them as escapes, and the job
    is fenced rather than refused."""
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\ncat <<'EOF'\n"
                        "JobId=8 JobName=evil\x1b[2Jname\n"
                        "   UserId=root(0) Account=phys\x07ics\n"
                        "   Partition=gpu\n   NodeList=vm\n"
                        "     Nodes=vm CPU_IDs=0 Mem=0 GRES=shard:2(IDX:1)\n"
                        "   Command=/bin/true\n   WorkDir=/\nEOF\n")
    scontrol.chmod(0o755)
    r = hook(node, "prolog", SLURM_JOB_ID="8", SLURM_JOB_UID=str(os.getuid()),
             SLURM_JOB_GPUS="1", SLURMD_NODENAME="vm",
             PATH=f"{tmp_path}:{os.environ['PATH']}")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    job = next(j for j in node.jobs() if j["slurm_job"] == "8")
    assert job["name"] == "evil\\x1b[2Jname" and job["slurm_account"] == "phys\\x07ics"
    assert job["mem_limit"] == 2 << 30
