"""What `ps`, `status`, `top` and the metrics show: the live jobs and GPUs as
the model's views (vgpuctl.core.job). Pure reads of the daemon's state:
nothing here reads a region, writes the store or changes a job; a job's
counters are the last reading the tick took (vgpuctl.daemon.trust), its
memory by NVML what the violation watch attributed to it at its last check.

Who sees what: every user sees every job's id, name, user, GPU, limits,
usage and violations; a job's command line and directory only its owner
and root (the daemon's user) see, unless the operator sets
``public_commands`` (`viewer`)."""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from vgpuctl.core import placement
from vgpuctl.core.config import Config
from vgpuctl.core.job import (
    GpuLive,
    GpuPart,
    GpuView,
    JobRecord,
    JobView,
    Live,
    gpu_parts,
    job_view,
)
from vgpuctl.daemon.jobs import LiveJob, commitments
from vgpuctl.system.nvml import GpuStats


def _live(job: LiveJob, stats: Mapping[str, GpuStats]) -> Live:
    """What is known of a live job: on each of its GPUs its last trusted
    counters, NVML's memory for its processes, its measured share."""
    per_gpu = []
    for i, uuid in enumerate(job.rec.uuids):
        st = stats.get(uuid)
        mem_nvml = None
        if st is not None and st.memory_used is not None:
            mem_nvml = job.held.get(uuid, 0)
        per_gpu.append(GpuLive(usage=job.usage[i] if i < len(job.usage) else None,
                               mem_nvml=mem_nvml, measured=job.measured.get(uuid)))
    return Live(gpus=tuple(per_gpu), violations=tuple(job.violations))


def live_job(job: LiveJob, stats: Mapping[str, GpuStats], now: float) -> JobView:
    """A live job's view: its record, and what is known of it live."""
    return job_view(job.rec, _live(job, stats), now)


def live_job_parts(job: LiveJob, stats: Mapping[str, GpuStats],
                   now: float) -> tuple[JobView, list[GpuPart]]:
    """A live job's view, and its part on each of its GPUs typed (the
    metrics read these; the view's per_gpu is their wire form), from one
    reading of what is known of it live."""
    live = _live(job, stats)
    return job_view(job.rec, live, now), gpu_parts(job.rec, live)


def viewer(uid: int, admin: bool, public: bool) -> Callable[[JobView], JobView]:
    """What a user asking for `ps` may see of each job: everything of their
    own jobs (root and the daemon's user: of every job); of another user's,
    all but its command line and directory, unless public."""
    def show(view: JobView) -> JobView:
        if admin or public or view.uid == uid:
            return view
        return replace(view, command=None, cwd=None)
    return show


def ended_job(rec: JobRecord, violations: Sequence[dict[str, Any]], now: float) -> JobView:
    return job_view(rec, Live(violations=tuple(violations)), now)


def gpus(gpus: Sequence[placement.Gpu], stats: Mapping[str, GpuStats], config: Config,
         jobs: Iterable[LiveJob], drained: Container[str] = ()) -> list[GpuView]:
    """The GPUs as every output shows them: a suspended job is on none."""
    jobs = [j for j in jobs if not j.rec.suspended]
    cm = commitments(jobs)
    used = placement.committed(cm)
    cores = placement.promised(cm)
    out = []
    for g in gpus:
        st = stats.get(g.uuid)
        out.append(GpuView(
            index=g.index, uuid=g.uuid, name=g.name, memory_total=g.total,
            memory_used=st.memory_used if st else None,
            utilization=st.utilization if st else None,
            committed=used.get(g.uuid, 0),
            capacity=placement.capacity(g, config.reserve, config.oversubscribe),
            core_promised=cores.get(g.uuid, 0),
            core_capacity=placement.core_capacity(config.core_oversubscribe),
            jobs=sum(1 for j in jobs if g.uuid in j.uuids()),
            minor=st.minor if st else None,
            slurm=config.slurm.controls(g.index),
            drained=g.uuid in drained,
            parent=g.parent, mig=g.mig, gi=st.gi if st else None,
            ci=st.ci if st else None))
    return out
