"""Slurm's shards as vgpuctl limits (vgpuctl.core.slurm_text): what a Prolog
reads from scontrol, the limits a count of shards gives, the gres.conf that
matches the daemon, and which registered jobs the controller has ended."""

from __future__ import annotations

import pytest

from vgpuctl.core import slurm_text as S
from vgpuctl.errors import AdmissionRefused, UsageError

G = 1 << 30

# `scontrol show job -d 1` of Slurm 22.05.8 for `srun --gres=shard:4 ...`, as a
# Prolog sees it (the job is still in its Prolog).
SHOW_JOB = """\
JobId=1 JobName=train
   UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A
   Priority=4294901759 Nice=0 Account=physics QOS=(null)
   JobState=RUNNING Reason=Prolog Dependency=(null)
   Partition=gpu AllocNode:Sid=localhost:20153
   NodeList=vm
   TRES=cpu=1,node=1,billing=1
   JOB_GRES=shard:4
     Nodes=vm CPU_IDs=0 Mem=0 GRES=shard:4(IDX:1)
   Command=/home/alice/train.sh --epochs 3
   WorkDir=/home/alice
   TresPerNode=gres:shard:4
"""


def test_a_prolog_reads_its_nodes_shards_and_gpu_from_scontrol():
    job = S.parse_job(SHOW_JOB, "vm")
    assert job == S.SlurmJob(job_id="1", name="train", partition="gpu", account="physics",
                             command="/home/alice/train.sh --epochs 3",
                             work_dir="/home/alice", shards=4, gpus=(1,), gpu_shards=(4,))


def test_a_job_without_shards_on_this_node_has_none():
    gpu_job = SHOW_JOB.replace("GRES=shard:4(IDX:1)", "GRES=gpu:sim:1(IDX:0)")
    assert S.parse_job(gpu_job, "vm").shards is None
    assert S.parse_job(SHOW_JOB, "other").shards is None
    no_account = S.parse_job(SHOW_JOB.replace("Account=physics", "Account=(null)"), "vm")
    assert no_account.account is None


def test_a_multi_node_job_counts_the_line_that_names_this_node():
    text = SHOW_JOB.replace(
        "     Nodes=vm CPU_IDs=0 Mem=0 GRES=shard:4(IDX:1)",
        "     Nodes=gpu[01-02] CPU_IDs=0 Mem=0 GRES=gpu:sim:0,shard:sim:2(IDX:0-1)\n"
        "     Nodes=gpu03 CPU_IDs=0 Mem=0 GRES=shard:6(IDX:0)")
    assert (S.parse_job(text, "gpu02").shards, S.parse_job(text, "gpu02").gpus) == (2, (0, 1))
    assert (S.parse_job(text, "gpu03").shards, S.parse_job(text, "gpu03").gpus) == (6, (0,))


def test_shards_on_several_gpus_are_read_per_gpu_where_slurm_says_so():
    """Slurm 23.11.2 and later (MULTIPLE_SHARING_GRES_PJ) write each GPU's
    allocated/available shards, in gres.conf's order; earlier ones only the
    GPUs' indices, which say the count only for shards on one GPU."""
    new = SHOW_JOB.replace("GRES=shard:4(IDX:1)", "GRES=shard:20(0/16,16/16,4/16)")
    job = S.parse_job(new, "vm")
    assert (job.shards, job.gpus, job.gpu_shards) == (20, (1, 2), (16, 4))
    typed = SHOW_JOB.replace("GRES=shard:4(IDX:1)", "GRES=gpu:h100:0,shard:h100:12(8/15,4/15)")
    assert S.parse_job(typed, "vm").gpu_shards == (8, 4)
    old = SHOW_JOB.replace("GRES=shard:4(IDX:1)", "GRES=shard:20(IDX:0-1)")
    job = S.parse_job(old, "vm")
    assert (job.shards, job.gpus, job.gpu_shards) == (20, (0, 1), ())
    with pytest.raises(UsageError, match="do not add up"):
        S.parse_job(SHOW_JOB.replace("GRES=shard:4(IDX:1)", "GRES=shard:20(8/16,4/16)"), "vm")
    with pytest.raises(UsageError, match="unexpected shard counts"):
        S.parse_job(SHOW_JOB.replace("GRES=shard:4(IDX:1)", "GRES=shard:4(4/x)"), "vm")


def test_shards_scontrol_places_on_no_gpu_are_counted_on_none():
    job = S.parse_job(SHOW_JOB.replace("GRES=shard:4(IDX:1)", "GRES=shard:3"), "vm")
    assert (job.shards, job.gpus, job.gpu_shards) == (3, (), ())


def test_scontrol_output_without_a_job_is_an_error():
    with pytest.raises(UsageError, match="JobId"):
        S.parse_job("slurm_load_jobs error: Invalid job id specified", "vm")
    with pytest.raises(UsageError, match="JobId"):
        S.parse_job(SHOW_JOB.replace("JobId=1", "JobId=x"), "vm")


def test_host_lists_expand_as_slurm_writes_them():
    assert S.expand_hostlist("vm") == ["vm"]
    assert S.expand_hostlist("n[1-3,07],gpu05") == ["n1", "n2", "n3", "n07", "gpu05"]
    assert S.expand_hostlist("r[1-2]n[01-02]") == ["r1n01", "r1n02", "r2n01", "r2n02"]


def test_shards_become_memory_and_a_proportional_share():
    per_gpu = S.shards_per_gpu(16 * G, G)
    assert per_gpu == 16
    assert S.shard_limits(4, per_gpu, G) == (4 * G, 25)
    assert S.shard_limits(8, per_gpu, G) == (8 * G, 50)
    assert S.shard_limits(16, per_gpu, G) == (16 * G, 100)
    assert S.shards_per_gpu(15 * G + G // 2, G) == 15     # the default 512M reserve
    assert S.shard_limits(1, 300, G)[1] == 1               # never 0 %


def test_more_shards_than_the_gpu_carries_is_refused_naming_the_mismatch():
    with pytest.raises(AdmissionRefused, match="16 shards of 1G do not fit: this GPU carries 15"):
        S.shard_limits(16, 15, G)
    with pytest.raises(UsageError):
        S.shards_per_gpu(16 * G, 0)


def test_gres_conf_lists_gpus_in_minor_order_with_the_daemons_counts():
    gpus = [S.GresGpu(1, "GPU-b", 16 * G), S.GresGpu(0, "GPU-a", 15 * G + G // 2)]
    text = S.gres_conf(gpus, G, node="vm", dev_dir="/dev", gpu_type="h100")
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert lines == [
        "AutoDetect=off",
        "Name=gpu Type=h100 File=/dev/nvidia0 Flags=nvidia_gpu_env  # GPU-a",
        "Name=gpu Type=h100 File=/dev/nvidia1 Flags=nvidia_gpu_env  # GPU-b",
        "Name=shard Count=15 File=/dev/nvidia0 Flags=nvidia_gpu_env",
        "Name=shard Count=16 File=/dev/nvidia1 Flags=nvidia_gpu_env",
    ]
    assert text.splitlines()[-1] == "# slurm.conf: NodeName=vm ... Gres=gpu:h100:2,shard:31"


# The driver's /proc/driver/nvidia-caps/mig-minors, in part: GPU minor 0's
# GPU instances 1 and 2 with their compute instance 0.
MIG_MINORS = """\
config 1
monitor 2
gpu0/gi1/access 12
gpu0/gi1/ci0/access 13
gpu0/gi2/access 21
gpu0/gi2/ci0/access 22
gpu1/gi1/access 147
gpu1/gi1/ci0/access 148
"""
# GPU 0 (/dev/nvidia1) whole; GPU 1 (/dev/nvidia0) in MIG mode: a 3g.40gb at
# slice 4 (GPU instance 1) and a 1g.10gb at slice 0 (GPU instance 2).
MIG_NODE = [S.GresGpu.of(0, "GPU-a", 80 * G, 1),
            S.GresGpu.of(14, "MIG-b", 40 * G, 0, parent=1, mig="3g.40gb", gi=1, ci=0),
            S.GresGpu.of(10, "MIG-c", 10 * G, 0, parent=1, mig="1g.10gb", gi=2, ci=0)]


def test_mig_minors_name_each_capabilitys_device_minor():
    minors = S.parse_mig_minors(MIG_MINORS)
    assert minors["gpu0/gi1"] == 12 and minors["gpu0/gi1/ci0"] == 13
    assert minors["gpu1/gi1/ci0"] == 148 and "config" not in minors


def test_mig_devices_take_their_gpus_place_in_gres_conf_by_slice():
    assert [g.uuid for g in S.slurm_order(MIG_NODE)] == ["MIG-c", "MIG-b", "GPU-a"]
    text = S.gres_conf(MIG_NODE, G, node="vm", gpu_type="h100",
                       mig_minors=S.parse_mig_minors(MIG_MINORS))
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    cap = "/dev/nvidia-caps/nvidia-cap"
    assert lines == [
        "AutoDetect=off",
        f"Name=gpu Type=h100_1g.10gb File={cap}22 Flags=nvidia_gpu_env"
        "  # MIG-c (1g.10gb of /dev/nvidia0)",
        f"Name=gpu Type=h100_3g.40gb File={cap}13 Flags=nvidia_gpu_env"
        "  # MIG-b (3g.40gb of /dev/nvidia0)",
        "Name=gpu Type=h100 File=/dev/nvidia1 Flags=nvidia_gpu_env  # GPU-a",
        f"Name=shard Count=10 File={cap}22 Flags=nvidia_gpu_env",
        f"Name=shard Count=40 File={cap}13 Flags=nvidia_gpu_env",
        "Name=shard Count=80 File=/dev/nvidia1 Flags=nvidia_gpu_env",
    ]
    assert text.splitlines()[-1] == ("# slurm.conf: NodeName=vm ... Gres=gpu:h100_1g.10gb:1,"
                                     "gpu:h100_3g.40gb:1,gpu:h100:1,shard:130")
    untyped = S.gres_conf(MIG_NODE, 2 * G, mig_minors=S.parse_mig_minors(MIG_MINORS))
    assert f"Name=gpu File={cap}22 Flags=nvidia_gpu_env  # MIG-c (1g.10gb of /dev/nvidia0)" \
        in untyped.splitlines()
    assert f"Name=shard Count=5 File={cap}22 Flags=nvidia_gpu_env" in untyped.splitlines()
    assert untyped.splitlines()[-1].endswith("Gres=gpu:3,shard:65")


def test_a_mig_device_the_minors_do_not_name_is_an_error_not_a_wrong_line():
    with pytest.raises(UsageError, match="the MIG minors name no gpu0/gi2/ci0/access "
                       r"\(MIG device MIG-c\)"):
        S.gres_conf(MIG_NODE, G, mig_minors=S.parse_mig_minors("gpu0/gi1/ci0/access 13\n"))
    with pytest.raises(UsageError, match="the MIG minors name no"):
        S.gres_conf(MIG_NODE, G)
    old = [S.GresGpu.of(10, "MIG-c", 10 * G, None, parent=1, mig="1g.10gb")]
    with pytest.raises(UsageError, match="does not say MIG device MIG-c's GPU and compute"):
        S.gres_conf(old, G, mig_minors={})


def test_jobs_the_controller_ended_or_forgot_are_gone():
    states = S.parse_squeue("5 RUNNING\n6 COMPLETING\n7 COMPLETED\n8 CANCELLED+\n9 PENDING\n")
    assert states["8"] == "CANCELLED+"
    assert S.gone(["5", "6", "7", "8", "9", "10"], states) == ["7", "8", "10"]
    assert S.gone(["5"], {}) == []          # an empty list says nothing
