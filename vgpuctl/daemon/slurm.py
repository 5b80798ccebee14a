"""Slurm's jobs: registered by the Prolog (root), joined by each task
(TaskProlog), released by the Epilog, and ended here when squeue says the
Slurm job is gone and its Epilog never came (docs/slurm_text.md). The arithmetic
(shards to limits, which jobs are gone) is vgpuctl.core.slurm_text's."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from vgpuctl.core import placement, slurm_text
from vgpuctl.core import protocol as P
from vgpuctl.core.config import Config
from vgpuctl.core.job import RUNNING, JobGpu, JobRecord
from vgpuctl.core.sizes import format_size
from vgpuctl.daemon.admission import Admission, user_name
from vgpuctl.daemon.jobs import JobTable, LiveJob
from vgpuctl.errors import AdmissionRefused, NotFound, PermissionDenied, UsageError
from vgpuctl.system.nvml import GpuStats

log = logging.getLogger("vgpuctl.daemon")

# Refusals kept for the tasks of Slurm jobs whose Epilog never came.
MAX_REFUSED = 4096


class SlurmJobs:
    def __init__(self, config: Callable[[], Config], admission: Admission, table: JobTable,
                 stats: Mapping[str, GpuStats]) -> None:
        self._config = config
        self._admission = admission
        self._table = table
        self._stats = stats
        # Slurm job id -> (uid, why): registrations refused, for the job's
        # TaskProlog to fail its steps with the reason (until the Epilog).
        self._refused: dict[str, tuple[int, str]] = {}

    def gpu(self, index: int) -> placement.Gpu:
        """Slurm's GPU ``index``: the index-th GPU or MIG device in the order
        of gres.conf's lines (slurm_text.slurm_order, `vgpuctl slurm gres-conf`)."""
        gpus = {g.uuid: g for g in self._admission.gpus}
        ordered = slurm_text.slurm_order(self._gres_gpu(g) for g in gpus.values())
        if not 0 <= index < len(ordered):
            what = "GPUs and MIG devices" if any(g.parent is not None for g in ordered) \
                else "GPUs"
            raise NotFound(f"Slurm's GPU {index} is not here: this node has {len(ordered)} "
                           f"{what} (gres.conf and vgpuctl disagree; see `vgpuctl slurm "
                           "gres-conf`)")
        return gpus[ordered[index].uuid]

    def _gres_gpu(self, g: placement.Gpu) -> slurm_text.GresGpu:
        """g as slurm_order reads it (its capacity is not needed there)."""
        st = self._stats.get(g.uuid)
        return slurm_text.GresGpu.of(g.index, g.uuid, 0, st.minor if st else None,
                                     g.parent, g.mig)

    def register(self, req: P.SlurmRegister) -> tuple[LiveJob, bool]:
        """The job of a Slurm job (registering twice is harmless): the live
        job, and whether it was registered before."""
        job = self._table.by_slurm(req.slurm_job)
        if job is not None:
            if job.rec.uid != req.uid:
                raise UsageError(f"Slurm job {req.slurm_job} is registered for uid "
                                 f"{job.rec.uid}, not {req.uid}")
            return job, True
        try:
            job = self._register(req)
        except (AdmissionRefused, NotFound, UsageError, PermissionDenied) as e:
            self._refused.pop(req.slurm_job, None)
            self._refused[req.slurm_job] = (req.uid, str(e))
            while len(self._refused) > MAX_REFUSED:     # missed Epilogs: forget the oldest
                del self._refused[next(iter(self._refused))]
            log.warning("Slurm job %s of uid %d refused: %s", req.slurm_job, req.uid, e)
            raise
        self._refused.pop(req.slurm_job, None)
        return job, False

    def _register(self, req: P.SlurmRegister) -> LiveJob:
        cfg = self._config()
        counts = self.shards_on_gpus(req)
        size = cfg.slurm.shard_size
        policy = req.policy or cfg.default_policy
        cls = req.priority or cfg.priority.default
        self._admission.check_priority(cls, req.uid, user_name(req.uid), False)
        placed = []
        for index, shards in counts:
            gpu = self.gpu(index)
            per_gpu = slurm_text.shards_per_gpu(
                placement.capacity(gpu, cfg.reserve, cfg.oversubscribe), size)
            mem, core = slurm_text.shard_limits(shards, per_gpu, size)
            core = req.core or core
            if req.ask_core is not None:     # a job may take less than its share, not more
                core = min(core, req.ask_core)
            # nothing is committed before the job is created: each GPU alone;
            # its share is a promise there (a low job's, a cap only)
            placement.place(self._admission.gpus, self._table.commitments(), mem,
                            pin=gpu.uuid, reserve=cfg.reserve, oversubscribe=cfg.oversubscribe,
                            core=core if cls != "low" else 0,
                            core_oversubscribe=cfg.core_oversubscribe)
            placed.append((gpu, mem, core))
        mem = max(m for _, m, _ in placed)
        core = max(c for _, _, c in placed)
        gpus = [JobGpu(gpu.index, gpu.uuid, m if m != mem else None, c if c != core else None)
                for gpu, m, c in placed]
        now = self._table.clock()
        rec = JobRecord(name=req.name or f"slurm-{req.slurm_job}", uid=req.uid,
                        user=user_name(req.uid),
                        command=[req.command or f"slurm job {req.slurm_job}"],
                        cwd=req.cwd or "/", gpus=gpus,
                        mem_limit=mem, core_share=core, policy=policy, created=now,
                        state=RUNNING, started=now, slurm_job=req.slurm_job,
                        slurm_partition=req.partition, slurm_account=req.account,
                        slurm_shards=req.shards, priority=cls, core_promised=True)
        job = self._admission.create(rec)
        log.info("job %s: Slurm job %s of %s registered on GPU %s: %d shards (%s), "
                 "%s, priority %s", rec.id, req.slurm_job, rec.user,
                 ",".join(str(g.index) for g, _, _ in placed), req.shards,
                 "; ".join(f"GPU {g.index}: mem {format_size(m)}, core {c}%"
                           for g, m, c in placed), policy, cls)
        return job

    @staticmethod
    def shards_on_gpus(req: P.SlurmRegister) -> list[tuple[int, int]]:
        """(Slurm's GPU index, shards there) for each GPU of the job, in
        index order. Shards on several GPUs need each GPU's count (Slurm
        23.11.2 and later say it); without it they are refused."""
        where = sorted(set(req.gpus))
        if len(where) == 1:
            return [(where[0], req.shards)]
        if req.gpu_shards is None or len(req.gpu_shards) != len(req.gpus) \
                or len(where) != len(req.gpus):
            raise AdmissionRefused(
                f"Slurm job {req.slurm_job} has shards on {len(where)} GPUs of this node "
                f"({', '.join(map(str, where))}) and scontrol does not say how many on each "
                "(Slurm 23.11.2 and later do): vgpuctl can't fence it")
        if sum(req.gpu_shards) != req.shards:
            raise UsageError(f"Slurm job {req.slurm_job}: shards per GPU "
                             f"{req.gpu_shards} do not add up to {req.shards}")
        return sorted(zip(req.gpus, req.gpu_shards, strict=True))

    def attached(self, slurm_job: str, uid: int, admin: bool) -> LiveJob:
        """The live job a task of a Slurm job joins; NotFound, or the reason
        its registration was refused."""
        job = self._table.by_slurm(slurm_job)
        if job is None:
            refused = self._refused.get(slurm_job)
            if refused is not None and (uid == refused[0] or admin):
                raise AdmissionRefused(f"vgpuctl refused Slurm job {slurm_job}: {refused[1]}")
            raise NotFound(f"Slurm job {slurm_job} is not registered with vgpuctl")
        return job

    def release(self, slurm_job: str) -> str | None:
        """End the Slurm job's job now (its Epilog); its id, or None."""
        self._refused.pop(slurm_job, None)
        job = self._table.by_slurm(slurm_job)
        if job is None:
            return None
        self._table.end(job)
        return job.id

    def registered(self) -> list[str]:
        """The Slurm job ids of the live jobs."""
        return [j.rec.slurm_job for j in self._table if j.rec.slurm_job is not None]

    def reconcile(self, asked: list[str], states: Mapping[str, str]) -> list[str]:
        """End the jobs of the Slurm jobs ``asked`` about (those registered
        before the controller was asked: a later one may be missing from its
        answer) that its list (job id -> state) shows ended or no longer
        has: an Epilog that never came."""
        ended = slurm_text.gone(asked, states)
        for sid in ended:
            job = self._table.by_slurm(sid)
            if job is not None:
                log.warning("Slurm job %s is %s: releasing job %s (its Epilog did not)", sid,
                            states.get(sid, "gone").lower(), job.id)
                self._table.end(job)
        return ended
