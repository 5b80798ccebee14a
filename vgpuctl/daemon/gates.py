"""The tick's compute step on the daemon's side: what the governor is given
of each live job (its counters, read once a tick through region trust, and
its processes), and the gates it sets, written back through region trust.

A job is gated and measured from its admission, not from its `started`: a
starting job's processes (the children of its `vgpuctl run`, and that
launcher itself, which holds the job's environment) are measured and its
gate set like any other's. Its launcher counts in its measured share for as
long as it lives: whatever a job's launcher runs on the GPU is the job's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vgpuctl.core.job import DeviceUsage, promised
from vgpuctl.core.trust import CLOSED, OPEN, Gate
from vgpuctl.daemon.jobs import JobTable
from vgpuctl.daemon.trust import Trust


@dataclass(frozen=True)
class Input:
    """One live job on one of its GPUs, this tick."""
    job_id: str
    index: int              # the GPU's place in the job's region
    uuid: str
    pids: frozenset[int]    # what the governor measures: its processes and its launcher
    core: int
    policy: str
    usage: DeviceUsage      # its counters (zeros when unknown)
    promised: bool = True   # its share is a promise (asked for; normal or high class)


class Gates:
    def __init__(self, table: JobTable, trust: Trust) -> None:
        self._table = table
        self._trust = trust

    def inputs(self) -> list[Input]:
        """Every live job with a region, on each of its GPUs; reads each
        job's counters once (a job found tampering is flagged then)."""
        out = []
        for job in self._table:
            if job.region is None or job.rec.suspended:   # a suspended job runs nothing
                continue
            usage = self._trust.read(job)
            rec = job.rec
            pids = frozenset(rec.pids) | ({rec.launcher_pid} if rec.launcher_pid else set())
            for i, uuid in enumerate(job.uuids()):
                u = usage[i] if i < len(usage) else DeviceUsage()
                out.append(Input(job.id, i, uuid, pids, rec.gpu_core_share(i), rec.policy, u,
                                 promised(rec)))
        return out

    def apply(self, inputs: list[Input], gates: Mapping[tuple[str, str], Any]) -> None:
        """Write the governor's gates (keyed by job id and GPU UUID): a
        closed gate stays closed, a hard share of 100 % has none (the hook's
        fast path)."""
        for inp in inputs:
            job = self._table.find(inp.job_id)
            g = gates.get((inp.job_id, inp.uuid))
            if job is None or g is None:
                continue
            if g.measured is not None:
                job.measured[inp.uuid] = g.measured
            target = getattr(g, "target", None)
            if target is not None:
                job.target[inp.uuid] = target
            if job.rec.region_error is not None:
                gate = CLOSED
            elif job.rec.gpu_core_share(inp.index) >= 100 and job.rec.policy == "hard" and (
                    inp.promised or not g.throttle):
                # a hard share of 100 % is no gate, unless it is no promise
                # and promised jobs beside it need their shares
                gate = OPEN
            else:
                gate = Gate(bool(g.throttle), int(g.refill_rate), int(g.bucket_size))
            self._trust.write_gate(job, inp.index, gate)

    def measured(self, job_id: str, uuid: str) -> float:
        job = self._table.find(job_id)
        return job.measured.get(uuid, 0.0) if job is not None else 0.0
