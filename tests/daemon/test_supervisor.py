"""The daemon's core driven directly: admission, regions, ownership, process
tracking and re-adoption, with real processes but no socket and no NVML."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from support.daemon import ask, read_line, wait_for

from vgpuctl.core import placement, turns
from vgpuctl.core import protocol as P
from vgpuctl.core.config import Config, SlurmConfig, UserLimits
from vgpuctl.daemon import requests, tracking
from vgpuctl.daemon.supervisor import Peer, Supervisor
from vgpuctl.store.database import Store
from vgpuctl.system.nvml import GpuStats
from vgpuctl.system.paths import DaemonPaths
from vgpuctl.system.region import Region
from vgpuctl.system.shm import shm_stat
from vgpuctl.system.structs import ffi as region_ffi
from vgpuctl.system.turn_fields import read_turn

G = 1 << 30
DEVICES = [GpuStats(0, "GPU-00000000-aaaa", "Sim GPU", 16 * G),
           GpuStats(1, "GPU-11111111-bbbb", "Sim GPU", 16 * G)]
ME = Peer(os.getpid(), os.getuid(), os.getgid())
OTHER = Peer(os.getpid(), 65534, 65534)


def make(tmp_path: Path, config: Config | None = None,
         devices: list[GpuStats] = DEVICES) -> Supervisor:
    dp = DaemonPaths(socket=tmp_path / "s.sock", runtime_dir=tmp_path / "run",
                     state_dir=tmp_path / "state", config=None, system=False)
    dp.jobs_dir.mkdir(parents=True, exist_ok=True)
    store = Store.open(dp.db)
    sup = Supervisor(config or Config(), dp, store, devices,
                     hook_library=lambda: tmp_path / "libvgpu.so")
    sup.test_store = store      # the test's handle, to close it as a dying daemon would not
    return sup


def call(sup, peer, op, **fields):
    reply = ask(sup, peer, P.encode_request(op, **fields))
    exc = P.reply_exception(reply)
    if exc is not None:
        raise exc
    return reply


def hook_reports_used(region_dir: str, used: int, i: int = 0) -> None:
    """Write the job's use of its GPU i into the region's usage file, where
    the hook writes it (region.h is the layout the two share)."""
    f = region_ffi()
    at = (f.offsetof("struct vgpu_usage", "dev") + i * f.sizeof("struct vgpu_dev_usage")
          + f.offsetof("struct vgpu_dev_usage", "used"))
    reg = Region.open(region_dir, writable_usage=True)
    try:
        reg.poke_usage(at, used.to_bytes(8, sys.byteorder))
    finally:
        reg.close()


def run(sup, peer=ME, **fields):
    fields.setdefault("command", ["sleep", "60"])
    fields.setdefault("cwd", "/")
    return call(sup, peer, "run", **fields)


@pytest.fixture
def procs():
    started = []

    def spawn(*argv):
        p = subprocess.Popen(list(argv) or ["sleep", "60"])
        started.append(p)
        return p
    yield spawn
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_run_places_creates_the_region_and_returns_the_env(tmp_path):
    sup = make(tmp_path)
    r = run(sup, mem=4 * G, core=30, name="train")
    job = r["job"]
    assert job["id"] == "1" and job["name"] == "train" and job["state"] == "starting"
    assert job["gpu"] == 0 and job["mem_limit"] == 4 * G and job["core"] == 30
    env = r["env"]
    assert env["VGPU_JOB"] == "1" and env["CUDA_VISIBLE_DEVICES"] == DEVICES[0].uuid
    assert r["prepend"]["LD_PRELOAD"].endswith("libvgpu.so")
    reg = Region.open(env["VGPU_REGION"])
    d = reg.device(0)
    # gated by turns from the start (its share is a cap even alone)
    assert (d.uuid, d.mem_limit, d.core_share, d.throttle) == (DEVICES[0].uuid, 4 * G, 30,
                                                               turns.TURNS)
    assert oct(os.stat(Path(env["VGPU_REGION"]) / "region").st_mode & 0o777) == "0o644"
    assert oct(shm_stat(reg.limits_id).perm.mode & 0o777) == "0o644"
    assert oct(shm_stat(reg.usage_id).perm.mode & 0o777) == "0o600"
    # The next job goes to the emptier GPU.
    assert run(sup, mem=G)["job"]["gpu"] == 1


def test_admission_refuses_what_does_not_fit_and_names_each_gpu(tmp_path):
    sup = make(tmp_path)
    run(sup, mem=15 * G)
    run(sup, mem=15 * G)
    with pytest.raises(P.errors.AdmissionRefused) as e:
        run(sup, mem=1 * G)
    assert "GPU 0" in str(e.value) and "GPU 1" in str(e.value)
    assert "512M left" in str(e.value)


def test_mem_is_required_unless_the_config_has_a_default(tmp_path):
    with pytest.raises(P.errors.UsageError, match="--mem is required"):
        run(make(tmp_path))
    sup = make(tmp_path / "b", Config(default_mem=2 * G, default_policy="soft"))
    job = run(sup)["job"]
    assert job["mem_limit"] == 2 * G and job["policy"] == "soft" and job["core"] == 100


def test_user_limits_apply(tmp_path):
    sup = make(tmp_path, Config(user_limits={"nobody": UserLimits(max_mem=2 * G)}))
    with pytest.raises(P.errors.AdmissionRefused, match="at most 2G"):
        run(sup, peer=OTHER, mem=3 * G)
    run(sup, peer=OTHER, mem=2 * G)


def test_job_ids_never_repeat_across_restarts(tmp_path):
    sup = make(tmp_path)
    run(sup, mem=G)
    call(sup, ME, "exited", job="1", code=0)
    assert call(sup, ME, "ps", job="1")["jobs"][0]["state"] == "ended"
    sup.test_store.close()
    sup2 = make(tmp_path)
    assert run(sup2, mem=G)["job"]["id"] == "2"


def test_only_owner_or_root_may_change_or_kill(tmp_path):
    sup = make(tmp_path)
    jid = run(sup, peer=OTHER, mem=G)["job"]["id"]
    mine = run(sup, mem=G)["job"]["id"]
    # this test runs as root or as some user; the "other" is nobody
    with pytest.raises(P.errors.PermissionDenied, match="only its owner or root"):
        call(sup, Peer(1, 12345, 12345), "set", job=jid, core=10)
    with pytest.raises(P.errors.PermissionDenied):
        call(sup, Peer(1, 12345, 12345), "kill", job=mine)
    with pytest.raises(P.errors.PermissionDenied):
        call(sup, Peer(1, 12345, 12345), "reload")
    call(sup, OTHER, "set", job=jid, core=10)   # the owner may


def test_every_request_has_one_route():
    """Each request type of the protocol is answered by one op of the
    supervisor's table, through its one path (Supervisor.reply)."""
    assert set(requests.ROUTES) == set(typing.get_args(P.Request))


def test_a_kill_that_cannot_read_proc_is_answered_and_sends_nothing(tmp_path):
    sup = make(tmp_path)
    mine = run(sup, mem=G)["job"]["id"]

    async def unreadable():
        raise PermissionError(13, "Permission denied", "/proc")
    sup.scan = unreadable
    reply = ask(sup, ME, P.encode_request("kill", job=mine))
    assert reply["ok"] is False and reply["error"]["code"] == "internal"
    assert reply["error"]["message"].startswith("could not read /proc: ")
    assert mine in sup.table


def test_started_tracks_the_process_and_the_job_ends_with_it(tmp_path, procs):
    sup = make(tmp_path)
    r = run(sup, mem=G)
    jid, region = r["job"]["id"], Path(r["env"]["VGPU_REGION"])
    p = procs("sleep", "60")
    call(sup, ME, "started", job=jid, pid=p.pid)
    sup.track(tracking.scan())
    assert sup.view(sup.table.get(jid))["pids"] == [p.pid]
    p.kill()
    p.wait()
    sup.track(tracking.scan())
    # The launcher (this test process) still runs and has not said "exited".
    assert jid in sup.table
    call(sup, ME, "exited", job=jid, signal=9)
    assert jid not in sup.table and not region.exists()
    ended = call(sup, ME, "ps", job=jid)["jobs"][0]
    assert ended["state"] == "ended" and ended["exit_signal"] == 9


def test_descendants_belong_to_the_job_even_after_their_parent_exits(tmp_path, procs):
    sup = make(tmp_path)
    jid = run(sup, mem=G)["job"]["id"]
    # sh starts a grandchild sleep and waits on a pipe.
    sh = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; read x"], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True)
    grandchild = int(read_line(sh.stdout))
    try:
        call(sup, ME, "started", job=jid, pid=sh.pid)
        sup.track(tracking.scan())
        assert set(sup.view(sup.table.get(jid))["pids"]) == {sh.pid, grandchild}
        sh.stdin.close()
        sh.wait()
        call(sup, ME, "exited", job=jid, code=0)
        assert jid in sup.table                  # the grandchild still runs
        sup.track(tracking.scan())
        assert sup.view(sup.table.get(jid))["pids"] == [grandchild]
        reply = call(sup, ME, "kill", job=jid, signal=15)
        assert reply["pids"] == [grandchild]
        wait_for(lambda: tracking.start_time(grandchild) is None, what="the grandchild to go")
        sup.track(tracking.scan())
        assert jid not in sup.table
    finally:
        try:
            os.kill(grandchild, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_job_whose_launcher_died_before_starting_ends(tmp_path):
    sup = make(tmp_path)
    launcher = subprocess.Popen([sys.executable, "-c", "pass"])
    launcher.wait()
    dead = Peer(launcher.pid, os.getuid(), os.getgid())
    jid = run(sup, peer=dead, mem=G)["job"]["id"]
    sup.track(tracking.scan())
    assert jid not in sup.table


def test_set_changes_limits_live_and_warns_below_use(tmp_path):
    sup = make(tmp_path)
    r = run(sup, mem=4 * G)
    jid = r["job"]["id"]
    hook_reports_used(r["env"]["VGPU_REGION"], 3 * G)
    reply = call(sup, ME, "set", job=jid, mem=2 * G, core=50, policy="soft")
    assert "keeps what it holds" in reply["warnings"][0]
    d = Region.open(r["env"]["VGPU_REGION"]).device(0)
    assert (d.mem_limit, d.core_share, d.policy) == (2 * G, 50, 1)
    # An increase is checked against what the GPU has left.
    run(sup, mem=12 * G, gpu="0")
    with pytest.raises(P.errors.AdmissionRefused):
        call(sup, ME, "set", job=jid, mem=4 * G)
    call(sup, ME, "set", job=jid, mem=3 * G + 512 * (1 << 20))


def test_unknown_job(tmp_path):
    sup = make(tmp_path)
    with pytest.raises(P.errors.NotFound, match="no job 42"):
        call(sup, ME, "kill", job="42")


def test_restart_readopts_live_jobs_and_ends_the_rest(tmp_path, procs):
    sup = make(tmp_path)
    launcher = procs("sleep", "60")        # stands for the `vgpuctl run` of both jobs
    by_launcher = Peer(launcher.pid, os.getuid(), os.getgid())
    alive = run(sup, peer=by_launcher, mem=G, core=40)
    dead = run(sup, peer=by_launcher, mem=G)
    p = procs("sleep", "60")
    q = procs("sleep", "60")
    call(sup, ME, "started", job=alive["job"]["id"], pid=p.pid)
    call(sup, ME, "started", job=dead["job"]["id"], pid=q.pid)
    q.kill()
    q.wait()
    # The daemon dies without a word (no close, no store update), and so
    # does the launcher.
    launcher.kill()
    launcher.wait()
    sup2 = make(tmp_path)
    sup2.adopt(tracking.scan())
    jobs = call(sup2, ME, "ps")["jobs"]
    assert [(j["id"], j["core"], j["pids"]) for j in jobs] == [("1", 40, [p.pid])]
    assert Region.open(alive["env"]["VGPU_REGION"]).device(0).core_share == 40
    assert call(sup2, ME, "ps", job="2")["jobs"][0]["state"] == "ended"
    assert not Path(dead["env"]["VGPU_REGION"]).exists()
    assert Path(alive["env"]["VGPU_REGION"]).exists()


def test_garbage_gets_an_error_reply(tmp_path):
    sup = make(tmp_path)
    for line in (b"\x00\x01\x02", b"{}", b'{"v":1,"op":"run","command":5,"cwd":"/"}'):
        reply = ask(sup, ME, line)
        assert reply["ok"] is False and reply["error"]["code"] == "protocol"
    assert ask(sup, ME, P.encode_request("ping"))["ok"] is True


def turn_of(r, i: int = 0) -> turns.Turn:
    """The gate and turn a job's hook reads from its region now."""
    reg = Region.open(r["env"]["VGPU_REGION"])
    try:
        return read_turn(reg, i)
    finally:
        reg.close()


CYCLE = turns.CYCLE_NS
# What a GPU's turns may fill when no job there borrows: they are stretched
# over it, their credit their shares (vgpuctl.core.turns).
ROOM = CYCLE - int(turns.GUARD_MIN * CYCLE)


def test_a_job_is_gated_by_its_turn_before_run_answers(tmp_path):
    """No job runs ungated until the first tick: by the time `run` answers
    (and the job's command can launch), its region holds its turn."""
    sup = make(tmp_path)
    r = run(sup, mem=G, core=30)
    t = turn_of(r)
    assert t.gate == turns.TURNS
    assert (t.start_ns, t.len_ns, t.credit_ns, t.cycle_ns) == (0, ROOM, 3 * CYCLE // 10,
                                                               CYCLE)
    assert t.share == pytest.approx(0.30)
    assert not t.borrow and t.open == ()          # hard: its turn, nothing more
    assert sup.trust.gate(sup.table.get(r["job"]["id"]), 0) == t
    assert r["job"]["state"] == "starting"        # before it even started


def test_core_100_hard_alone_is_not_gated(tmp_path):
    """A job promised all of its GPU keeps the hook's fast path, and so
    does one that asked for no share."""
    sup = make(tmp_path)
    full = run(sup, mem=G, core=100, policy="hard", gpu="0")
    assert turn_of(full) == turns.OPEN_TURN
    assert Region.open(full["env"]["VGPU_REGION"]).device(0).throttle == turns.OPEN
    plain = run(sup, mem=G, gpu="1")
    assert plain["job"]["promised"] is False
    assert turn_of(plain) == turns.OPEN_TURN


def test_two_jobs_get_turns_apart_and_one_ending_replans_the_other(tmp_path):
    sup = make(tmp_path)
    a = run(sup, mem=G, core=30, gpu="0")
    b = run(sup, mem=G, core=60, gpu="0")
    ta, tb = turn_of(a), turn_of(b)
    assert ta.gate == tb.gate == turns.TURNS
    assert ta.epoch_ns == tb.epoch_ns and ta.cycle_ns == tb.cycle_ns == CYCLE
    assert (ta.start_ns, ta.len_ns, ta.credit_ns) == (0, ROOM // 3, 3 * CYCLE // 10)
    assert (tb.start_ns, tb.len_ns, tb.credit_ns) == (ROOM // 3, 2 * ROOM // 3, 6 * CYCLE // 10)
    # apart: one ends where the other begins
    assert ta.start_ns + ta.len_ns <= tb.start_ns
    # A job on the other GPU has nothing to do with them.
    other = run(sup, mem=G, core=50, gpu="1")
    assert turn_of(other).start_ns == 0 and turn_of(a) == ta and turn_of(b) == tb
    # The first ends: the second's turn is planned again at once (no tick).
    call(sup, ME, "exited", job=a["job"]["id"], code=0)
    tb2 = turn_of(b)
    assert tb2.gate == turns.TURNS and (tb2.start_ns, tb2.credit_ns) == (0, 6 * CYCLE // 10)
    assert tb2.epoch_ns == tb.epoch_ns            # the GPU's cycles stay where they were
    # ...and so when a share is set: 60 -> 100 hard alone is no cap at all.
    call(sup, ME, "set", job=b["job"]["id"], core=100)
    assert turn_of(b) == turns.OPEN_TURN


def test_a_job_with_no_promise_borrows_beside_a_promised_one(tmp_path, procs):
    """A job run without --core keeps the fast path alone; beside a job
    promised a share it gets no turn and runs in the rest of the cycle."""
    sup = make(tmp_path)
    r = run(sup, mem=G, gpu="0")
    assert r["job"]["promised"] is False and r["job"]["core"] == 100
    call(sup, ME, "started", job=r["job"]["id"], pid=procs("sleep", "60").pid)
    assert turn_of(r) == turns.OPEN_TURN
    hard = run(sup, mem=G, core=20, gpu="0")
    t = turn_of(r)
    assert t.gate == turns.TURNS and t.len_ns == 0 and t.credit_ns == 0
    assert t.borrow and t.borrow_ns == turns.BORROW_NS
    assert t.open == ((CYCLE // 5, CYCLE - CYCLE // 5),)
    assert (turn_of(hard).start_ns, turn_of(hard).len_ns) == (0, CYCLE // 5)
    # The promised job ends: alone again, the first is ungated again.
    call(sup, ME, "exited", job=hard["job"]["id"], code=0)
    assert turn_of(r) == turns.OPEN_TURN


def test_a_flagged_jobs_gate_is_closed_and_stays_closed(tmp_path):
    sup = make(tmp_path)
    bad = run(sup, mem=G, core=30, gpu="0")
    good = run(sup, mem=G, core=40, gpu="0")
    before = turn_of(good)
    reg = Region.open(bad["env"]["VGPU_REGION"], writable_usage=True)
    reg.poke_usage(0, b"garbage!")
    reg.close()
    call(sup, ME, "started", job=bad["job"]["id"], pid=os.getpid())
    sup.gates.step(sup.gates.inputs())           # a tick reads the region
    assert "header" in call(sup, ME, "ps", job=bad["job"]["id"])["jobs"][0]["region_error"]
    assert turn_of(bad) == turns.CLOSED_TURN
    assert Region.open(bad["env"]["VGPU_REGION"]).device(0).throttle == turns.CLOSED
    # Planning again (a tick, a change on its GPU) never opens it again.
    for _ in range(3):
        sup.refresh_gpus()
        sup.gates.step(sup.gates.inputs())
    # Its neighbour keeps its turn.
    assert turn_of(good) == before
    # A share set for it (here, by its owner) opens nothing either; the
    # neighbour keeps its turn of its share wherever it now lies (the
    # hand-over guard aside, now that the turns fill the cycle).
    call(sup, ME, "set", job=bad["job"]["id"], core=60, policy="soft")
    assert turn_of(bad) == turns.CLOSED_TURN
    t = turn_of(good)
    assert t.gate == turns.TURNS and t.share == pytest.approx(0.40, rel=0.02)


def test_job_env_puts_the_hook_and_libraries_first_once():
    from vgpuctl.client.launch import job_env

    env = job_env({"LD_PRELOAD": "/a.so /hook.so:/b.so", "LD_LIBRARY_PATH": "/x:/sim",
                   "KEEP": "1"}, {"VGPU_JOB": "4"},
                  {"LD_PRELOAD": "/hook.so", "LD_LIBRARY_PATH": "/sim"})
    assert env == {"LD_PRELOAD": "/hook.so:/a.so:/b.so", "LD_LIBRARY_PATH": "/sim:/x",
                   "KEEP": "1", "VGPU_JOB": "4"}
    assert job_env({}, {}, {"LD_PRELOAD": "/hook.so"}) == {"LD_PRELOAD": "/hook.so"}


# -- Slurm jobs (registered by root's Prolog) ------------------------------------
SLURM = Config(reserve=0, slurm=SlurmConfig(gpus=(1,)))


def register(sup, peer=ME, **fields):
    fields.setdefault("slurm_job", "77")
    fields.setdefault("uid", ME.uid)
    fields.setdefault("gpus", [1])
    fields.setdefault("shards", 4)
    return call(sup, peer, "slurm_register", **fields)


def test_a_slurm_job_is_registered_once_with_its_shards_as_limits(tmp_path):
    sup = make(tmp_path, SLURM)
    job = register(sup, partition="gpu", account="physics")["job"]
    assert (job["gpu"], job["mem_limit"], job["core"]) == (1, 4 * G, 25)   # 4 of 16 shards
    assert (job["slurm_job"], job["slurm_partition"], job["slurm_account"],
            job["slurm_shards"], job["state"]) == ("77", "gpu", "physics", 4, "running")
    again = register(sup, ask_core=90)
    assert again["existing"] is True and again["job"]["id"] == job["id"]
    # The job's own --vgpu-core may lower its share, never raise it.
    assert register(sup, slurm_job="78", shards=8, ask_core=20)["job"]["core"] == 20
    assert register(sup, slurm_job="79", shards=2, ask_core=90)["job"]["core"] == 12
    assert len(sup.table) == 3
    # Every task of the job attaches to the same job.
    a = call(sup, ME, "slurm_attach", slurm_job="77")
    assert a["job"]["id"] == job["id"] and a["env"]["VGPU_JOB"] == job["id"]
    assert a["env"]["CUDA_VISIBLE_DEVICES"] == DEVICES[1].uuid
    assert a["prepend"]["LD_PRELOAD"].endswith("libvgpu.so")


# GPU 0 whole (its device file /dev/nvidia1), GPU 1 (/dev/nvidia0) in MIG mode
# with a 3g.40gb at slice 4 and a 1g.10gb at slice 0: Slurm's order is
# gres.conf's, the MIG devices in their GPU's place by slice, then GPU 0.
MIG_NODE = [GpuStats(0, "GPU-00000000-aaaa", "Sim GPU", 80 * G, minor=1),
            GpuStats(2 + 8 + 4, "MIG-11111111-bbbb", "Sim GPU MIG 3g.40gb", 40 * G, minor=0,
                     parent=1, mig="3g.40gb", gi=1, ci=0),
            GpuStats(2 + 8 + 0, "MIG-22222222-cccc", "Sim GPU MIG 1g.10gb", 10 * G, minor=0,
                     parent=1, mig="1g.10gb", gi=2, ci=0)]


def test_slurms_gpu_index_names_mig_devices_in_gres_confs_order(tmp_path):
    sup = make(tmp_path, Config(reserve=0, slurm=SlurmConfig(gpus="all")), MIG_NODE)
    assert [sup.slurm.gpu(i).uuid for i in range(3)] == [
        "MIG-22222222-cccc", "MIG-11111111-bbbb", "GPU-00000000-aaaa"]
    # 5 of the 1g.10gb's 10 shards, 4 of the 3g.40gb's 40, 8 of GPU 0's 80
    for sid, index, shards, want in (("1", 0, 5, (10, 5 * G, 50)), ("2", 1, 4, (14, 4 * G, 10)),
                                     ("3", 2, 8, (0, 8 * G, 10))):
        job = register(sup, slurm_job=sid, gpus=[index], shards=shards)["job"]
        assert (job["gpu"], job["mem_limit"], job["core"]) == want
    a = call(sup, ME, "slurm_attach", slurm_job="2")
    assert a["env"]["CUDA_VISIBLE_DEVICES"] == "MIG-11111111-bbbb"
    with pytest.raises(P.errors.NotFound, match="Slurm's GPU 3 is not here: this node has 3 "
                       "GPUs and MIG devices"):
        register(sup, slurm_job="4", gpus=[3], shards=1)
    with pytest.raises(P.errors.AdmissionRefused, match="11 shards of 1G do not fit: this GPU "
                       "carries 10"):
        register(sup, slurm_job="5", gpus=[0], shards=11)


def test_a_slurm_job_outlives_its_processes_until_released(tmp_path, procs):
    sup = make(tmp_path, SLURM)
    register(sup)
    p = procs()
    call(sup, ME, "slurm_attach", slurm_job="77", pid=p.pid)
    sup.track(tracking.scan())
    assert sup.table.get("1").rec.pids == {p.pid: tracking.start_time(p.pid)}
    p.kill()
    p.wait()
    sup.track(tracking.scan())
    assert "1" in sup.table                       # no processes: still the Slurm job's
    region = Path(sup.table.get("1").rec.region)
    assert call(sup, ME, "slurm_release", slurm_job="77")["released"] == "1"
    assert not len(sup.table) and not region.exists()
    assert call(sup, ME, "slurm_release", slurm_job="77")["released"] is None
    # The shards are free again at once (no wait for a /proc scan).
    assert register(sup, slurm_job="78", shards=16)["job"]["mem_limit"] == 16 * G


def test_a_slurm_jobs_owner_can_neither_raise_its_limits_nor_end_it(tmp_path):
    sup = make(tmp_path, SLURM)
    owner = Peer(os.getpid(), 65534, 65534)
    jid = register(sup, uid=owner.uid)["job"]["id"]
    call(sup, owner, "slurm_attach", slurm_job="77")
    with pytest.raises(P.errors.PermissionDenied, match="only root may change"):
        call(sup, owner, "set", job=jid, mem=16 * G, core=100)
    with pytest.raises(P.errors.UsageError, match="ends at its Epilog"):
        call(sup, owner, "exited", job=jid, code=0)
    assert sup.table.get(jid).rec.mem_limit == 4 * G
    assert call(sup, ME, "set", job=jid, core=40)["job"]["core"] == 40    # root may


def test_only_root_registers_or_releases_a_slurm_job(tmp_path):
    sup = make(tmp_path, SLURM)
    for uid in (OTHER.uid, ME.uid):
        with pytest.raises(P.errors.PermissionDenied, match="only root"):
            register(sup, peer=OTHER, uid=uid)
    register(sup)
    with pytest.raises(P.errors.PermissionDenied, match="only root"):
        call(sup, OTHER, "slurm_release", slurm_job="77")
    with pytest.raises(P.errors.PermissionDenied):
        call(sup, OTHER, "slurm_attach", slurm_job="77")
    assert len(sup.table) == 1


def test_a_refused_registration_fails_the_jobs_tasks_with_the_reason(tmp_path):
    sup = make(tmp_path, SLURM)
    with pytest.raises(P.errors.AdmissionRefused, match="17 shards of 1G do not fit"):
        register(sup, shards=17)
    with pytest.raises(P.errors.AdmissionRefused, match="refused Slurm job 77: 17 shards"):
        call(sup, ME, "slurm_attach", slurm_job="77")
    with pytest.raises(P.errors.AdmissionRefused, match="on 2 GPUs .* does not say how many"):
        register(sup, slurm_job="79", gpus=[0, 1])
    with pytest.raises(P.errors.NotFound, match="not registered"):
        call(sup, ME, "slurm_attach", slurm_job="80")
    call(sup, ME, "slurm_release", slurm_job="77")      # the Epilog forgets the refusal
    with pytest.raises(P.errors.NotFound, match="not registered"):
        call(sup, ME, "slurm_attach", slurm_job="77")


def test_shards_on_two_gpus_are_fenced_on_each_by_its_own_count(tmp_path):
    """12 shards on GPU 0 and 4 on GPU 1: 12G and 75 % there, 4G and 25 %
    here, one job; its --vgpu-core lowers the share on each GPU."""
    sup = make(tmp_path, Config(reserve=0, slurm=SlurmConfig(gpus="all")))
    job = register(sup, gpus=[0, 1], shards=16, gpu_shards=[12, 4])["job"]
    assert (job["gpus"], job["mem_limit"], job["core"], job["slurm_shards"]) == (
        [0, 1], 12 * G, 75, 16)
    assert [(g["index"], g["mem_limit"], g["core"]) for g in job["per_gpu"]] == [
        (0, 12 * G, 75), (1, 4 * G, 25)]
    assert job["mem_limit_total"] == 16 * G
    region = Region.open(Path(sup.table.get(job["id"]).rec.region))
    assert [(region.device(i).mem_limit, region.device(i).core_share) for i in (0, 1)] == [
        (12 * G, 75), (4 * G, 25)]
    a = call(sup, ME, "slurm_attach", slurm_job="77")
    assert a["env"]["CUDA_VISIBLE_DEVICES"] == f"{DEVICES[0].uuid},{DEVICES[1].uuid}"
    # admission counts each GPU's own limit
    gpus = {g["index"]: g["committed"] for g in call(sup, ME, "ps")["gpus"]}
    assert gpus == {0: 12 * G, 1: 4 * G}
    asked = register(sup, slurm_job="78", gpus=[1, 0], shards=3, gpu_shards=[2, 1],
                     ask_core=10)["job"]
    assert [(g["index"], g["mem_limit"], g["core"]) for g in asked["per_gpu"]] == [
        (0, G, 6), (1, 2 * G, 10)]
    # (its share there, 31 %, is a promise too, and 81 % is promised)
    with pytest.raises(P.errors.AdmissionRefused,
                       match="no room for 5G and 31% of a GPU's compute: GPU 0"):
        register(sup, slurm_job="79", gpus=[0, 1], shards=7, gpu_shards=[5, 2])
    assert [g["committed"] for g in call(sup, ME, "ps")["gpus"]] == [13 * G, 6 * G]
    with pytest.raises(P.errors.UsageError, match="do not add up"):
        register(sup, slurm_job="80", gpus=[0, 1], shards=7, gpu_shards=[1, 2])
    # root's set gives every GPU one limit
    changed = call(sup, ME, "set", job=job["id"], mem=2 * G)["job"]
    assert [g["mem_limit"] for g in changed["per_gpu"]] == [2 * G, 2 * G]


def test_plain_runs_keep_off_slurms_gpus_unless_allowed(tmp_path):
    sup = make(tmp_path, SLURM)
    assert run(sup, mem=G)["job"]["gpu"] == 0
    assert run(sup, mem=G)["job"]["gpu"] == 0      # GPU 1 is emptier, but Slurm's
    with pytest.raises(P.errors.AdmissionRefused, match="GPU 1 is Slurm's"):
        run(sup, mem=G, gpu="1")
    allowed = Config(slurm=SlurmConfig(gpus="all", allow_run=True))
    assert run(make(tmp_path / "b", allowed), mem=G, gpu="1")["job"]["gpu"] == 1
    with pytest.raises(P.errors.AdmissionRefused, match="every GPU here is Slurm's"):
        run(make(tmp_path / "c", Config(slurm=SlurmConfig(gpus="all"))), mem=G)


def test_reconciliation_releases_the_slurm_jobs_squeue_shows_ended_or_forgot(tmp_path):
    sup = make(tmp_path, SLURM)
    for sid in ("1", "2", "3", "4"):
        register(sup, slurm_job=sid, shards=1)
    asked = sup.slurm.registered()
    register(sup, slurm_job="5", shards=1)        # registered while squeue ran
    assert sup.slurm.reconcile(asked, {}) == []   # an empty list says nothing
    gone = sup.slurm.reconcile(asked, {"1": "RUNNING", "2": "COMPLETING", "3": "CANCELLED+"})
    assert sorted(gone) == ["3", "4"]
    assert sorted(sup.slurm.registered()) == ["1", "2", "5"]


def test_a_restarted_daemon_keeps_a_slurm_job_with_no_processes(tmp_path):
    sup = make(tmp_path, SLURM)
    register(sup)
    sup.close()
    sup.test_store.close()
    sup2 = make(tmp_path, SLURM)
    sup2.adopt(tracking.scan())
    assert sup2.table.by_slurm("77") is not None
    assert call(sup2, ME, "slurm_release", slurm_job="77")["released"] == "1"



def test_views_never_change_a_job(tmp_path):
    """`ps` shows what the last tick read; reading it closes no gate."""
    sup = make(tmp_path)
    r = run(sup, mem=G)
    jid = r["job"]["id"]
    reg = Region.open(r["env"]["VGPU_REGION"], writable_usage=True)
    reg.poke_usage(0, b"garbage!")
    for _ in range(3):
        assert call(sup, ME, "ps", job=jid)["jobs"][0]["region_error"] is None
        call(sup, ME, "ps")
    assert not Region.open(r["env"]["VGPU_REGION"]).device(0).throttle
    call(sup, ME, "started", job=jid, pid=os.getpid())
    sup.gates.inputs()                          # the tick reads the region
    assert "header" in call(sup, ME, "ps", job=jid)["jobs"][0]["region_error"]


def test_a_starting_job_is_in_the_gates_inputs_with_its_launcher(tmp_path, procs):
    sup = make(tmp_path)
    launcher = procs("sleep", "60")
    jid = run(sup, peer=Peer(launcher.pid, ME.uid, ME.gid), mem=G, core=5)["job"]["id"]
    [inp] = sup.gates.inputs()
    assert (inp.on.job_id, inp.on.core) == (jid, 5) and launcher.pid in inp.pids
    sup.gates.step([inp])
    reg = Region.open(sup.table.get(jid).rec.region)
    t = read_turn(reg, 0)
    assert (t.gate, t.credit_ns) == (turns.TURNS, CYCLE * 5 // 100)


def test_a_user_flooding_admissions_is_capped_and_others_get_in(tmp_path):
    sup = make(tmp_path)
    flooder = Peer(os.getpid(), 65534, 65534)
    admitted = busy = 0
    for _ in range(200):
        reply = ask(sup, flooder, P.encode_request(
            "run", command=["x"], cwd="/", mem=64 << 20))
        if reply["ok"]:
            admitted += 1
        else:
            assert reply["error"]["code"] == "admission" and reply["error"]["retry"] is True
            busy += 1
    # Never more starting at once than max_starting: the rest were told to come back.
    assert admitted == 8 and busy == 192
    assert sum(1 for j in call(sup, ME, "ps")["jobs"] if j["uid"] == 65534) == 8
    # Another user (here the daemon's own) is admitted at once.
    assert run(sup, mem=G)["job"]["uid"] == ME.uid


def test_a_users_caps_count_jobs_memory_and_speed(tmp_path, procs):
    cfg = Config(default_limits=UserLimits(max_jobs=3, max_starting=None,
                                           admission_rate=1.0, max_total_share=0.5))
    sup = make(tmp_path, cfg)
    user = Peer(os.getpid(), 65534, 65534)
    for _ in range(2):
        run(sup, peer=user, mem=G)
    reply = ask(sup, user, P.encode_request("run", command=["x"], cwd="/", mem=G))
    assert "faster than 1 a second" in reply["error"]["message"]
    assert reply["error"]["retry"] is True          # `vgpuctl run` asks again
    # Half of the node's capacity (2 x 15.5G): 15.5G in all.
    sup.admission._rate = placement.AdmissionRate()      # a second later, say
    with pytest.raises(P.errors.AdmissionRefused, match=r"at most 15.5G \(50% of this node"):
        run(sup, peer=user, mem=14 * G)
    run(sup, peer=user, mem=G)
    sup.admission._rate = placement.AdmissionRate()
    with pytest.raises(P.errors.AdmissionRefused, match="has 3 jobs, the most"):
        run(sup, peer=user, mem=G)


def test_no_job_ever_holds_the_daemons_own_process(tmp_path, procs):
    """A daemon that a job's launcher started (the first `vgpuctl run` on a
    node) is below that launcher, where a job's processes are: it is never
    one of them, nor is what it runs."""
    sup = make(tmp_path)                        # the daemon: this process
    launcher = Peer(os.getppid(), ME.uid, ME.gid)   # ...is its launcher's child
    jid = run(sup, peer=launcher, mem=G)["job"]["id"]
    command = procs("sleep", "60")              # stands for the job's command
    child = procs("sleep", "60")                # what the daemon runs (squeue, say)
    call(sup, ME, "started", job=jid, pid=command.pid)
    sup.track(tracking.scan())
    pids = sup.view(sup.table.get(jid))["pids"]
    assert os.getpid() not in pids and child.pid not in pids
    # A job that names the daemon as its command does not get it either.
    other = run(sup, peer=launcher, mem=G)["job"]["id"]
    call(sup, ME, "started", job=other, pid=os.getpid())
    sup.track(tracking.scan())
    for j in call(sup, ME, "ps")["jobs"]:
        assert os.getpid() not in j["pids"] and child.pid not in j["pids"]
    assert os.getpid() not in call(sup, ME, "kill", job=other, signal=signal.SIGCONT)["pids"]


def test_a_job_named_after_its_command_gets_a_name_that_is_one_line(tmp_path):
    sup = make(tmp_path)
    job = run(sup, mem=G, command=["/opt/evil\nvgpud[1] ERROR forged\x1b[2J", "x"])["job"]
    assert job["name"] == "evil\\nvgpud[1] ERROR forged\\x1b[2J"
