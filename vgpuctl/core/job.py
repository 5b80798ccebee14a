"""The job, one model: what the daemon keeps of a job (`JobRecord`), and what
every output shows of it (`JobView`: `ps --json`, the `ps`/`top` tables and
CSV fields, the metrics). A GPU likewise (`GpuView`). Pure: no I/O.

Each output field is declared once, here, as a field of `JobView` or
`GpuView` with its kind and help text; the field tables `--fields` accepts
(`JOB_FIELDS`, `GPU_FIELDS`) derive from them, the daemon builds the wire
record from them (`JobView.wire`), and a test holds docs/cli.md's field
tables to them. Reports read `JobRecord`s straight from the database.
Adding a field is one line here and its line in docs/cli.md.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, fields, replace
from typing import Any

from vgpuctl.core.output import Field

STARTING = "starting"   # admitted, the command not yet started
RUNNING = "running"     # the command runs (root pid known)
SUSPENDED = "suspended" # its processes are checkpointed: no GPU holds them
ENDED = "ended"         # every process of the job is gone
STATES = (STARTING, RUNNING, SUSPENDED, ENDED)

# Why a job is suspended: its owner or root asked (it waits for `resume`), a
# job of a higher class took its memory, or its GPU was drained and no other
# had room (these two resume by themselves when room returns).
SUSPEND_REASONS = ("asked", "preempted", "drained")


def _whole(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class JobGpu:
    """One of a job's GPUs: where it is (its NVML index, its UUID) and its
    limits there where they differ from the job's (a Slurm job's shards;
    None: the job's own)."""
    index: int | None
    uuid: str
    mem_limit: int | None = None
    core_share: int | None = None

    @staticmethod
    def of(d: Any) -> JobGpu | None:
        """One from its stored or wire form (a dict); None for what is not."""
        if isinstance(d, JobGpu):
            return d
        if not isinstance(d, dict):
            return None
        return JobGpu(_whole(d.get("index")), str(d.get("uuid")),
                      _whole(d.get("mem_limit")), _whole(d.get("core_share")))

    def stored(self) -> dict[str, Any]:
        """Its stored form: index and uuid, and a limit only where it has one."""
        out: dict[str, Any] = {"index": self.index, "uuid": self.uuid}
        if self.mem_limit is not None:
            out["mem_limit"] = self.mem_limit
        if self.core_share is not None:
            out["core_share"] = self.core_share
        return out


@dataclass(frozen=True)
class JobOnGpu:
    """A job on one of its GPUs: the one projection of a job on a GPU that
    the daemon's parts derive theirs from (the turns' Share, the classes'
    Seat, the watch's JobLimits, the gates' Input)."""
    job_id: str
    uid: int
    dev: int            # the GPU's place in the job's region
    uuid: str
    mem_limit: int
    core: int           # its share there, percent
    policy: str
    priority: str
    promised: bool      # its share is a promise (asked for; normal or high class)
    gpus: int           # how many GPUs the job is on


@dataclass
class JobRecord:
    """A job as the daemon persists it (one row of the jobs table). id is
    "" until inserted."""
    name: str
    uid: int
    user: str
    command: list[str]
    cwd: str
    gpus: list[JobGpu]              # in placement order (dicts given are made JobGpus)
    mem_limit: int                  # bytes, on each GPU (the largest where they differ)
    core_share: int                 # percent, on each GPU (the largest where they differ)
    policy: str                     # hard | soft
    created: float                  # Unix time
    state: str = STARTING
    id: str = ""
    started: float | None = None
    ended: float | None = None
    launcher_pid: int | None = None     # the `vgpuctl run` process
    launcher_start: int | None = None   # its /proc starttime (clock ticks)
    root_pid: int | None = None         # the command's process
    root_start: int | None = None
    pids: dict[int, int] = field(default_factory=dict)   # {pid: starttime} seen
    exit_code: int | None = None
    exit_signal: int | None = None
    region: str | None = None           # the job's region directory
    slurm_job: str | None = None        # the Slurm job id (a job the Prolog registered)
    slurm_partition: str | None = None
    slurm_account: str | None = None
    slurm_shards: int | None = None
    region_error: str | None = None     # why its usage region was found tampered with
    priority: str = "normal"            # low | normal | high
    core_promised: bool = False         # its share counts in its GPU's compute (--core given)
    suspended_s: float = 0.0            # seconds it was suspended, suspensions that ended
    suspended_at: float | None = None   # when its current suspension began
    suspend_reason: str | None = None   # SUSPEND_REASONS, while suspended
    suspensions: int = 0                # times it was suspended

    @property
    def active(self) -> bool:
        return self.state != ENDED

    @property
    def suspended(self) -> bool:
        return self.state == SUSPENDED

    def suspended_for(self, now: float) -> float:
        """Seconds it has been suspended in all, the current suspension
        included."""
        cur = (max(0.0, now - self.suspended_at)
               if self.suspended_at is not None and self.state == SUSPENDED else 0.0)
        return self.suspended_s + cur

    def __post_init__(self) -> None:
        self.gpus = [g for g in map(JobGpu.of, self.gpus) if g is not None]

    @property
    def uuids(self) -> list[str]:
        """The UUIDs of its GPUs, in placement order."""
        return [g.uuid for g in self.gpus]

    @property
    def indices(self) -> list[int | None]:
        """The NVML indices of its GPUs, in placement order."""
        return [g.index for g in self.gpus]

    def gpu_mem_limit(self, i: int) -> int:
        """The memory limit on its i-th GPU (placement order)."""
        v = self.gpus[i].mem_limit if 0 <= i < len(self.gpus) else None
        return v if v is not None else self.mem_limit

    def gpu_core_share(self, i: int) -> int:
        """The compute share on its i-th GPU (placement order)."""
        v = self.gpus[i].core_share if 0 <= i < len(self.gpus) else None
        return v if v is not None else self.core_share

    def on_gpus(self) -> list[JobOnGpu]:
        """The job on each of its GPUs, in placement order."""
        return [JobOnGpu(self.id, self.uid, i, g.uuid, self.gpu_mem_limit(i),
                         self.gpu_core_share(i), self.policy, self.priority,
                         promised(self), len(self.gpus))
                for i, g in enumerate(self.gpus)]

    def limits_by_uuid(self) -> dict[str, tuple[int, int]]:
        """Each GPU's (memory limit, core share), by UUID."""
        return {u: (self.gpu_mem_limit(i), self.gpu_core_share(i))
                for i, u in enumerate(self.uuids)}

    def set_limits(self, mem: int | None = None, core: int | None = None) -> None:
        """One memory limit, or one share, on every GPU (`vgpuctl set`)."""
        self.gpus = [replace(g, mem_limit=None if mem is not None else g.mem_limit,
                             core_share=None if core is not None else g.core_share)
                     for g in self.gpus]
        if mem is not None:
            self.mem_limit = mem
        if core is not None:
            self.core_share = core

    @property
    def start(self) -> float:
        """When its command started (when it was admitted, until then)."""
        return self.started if self.started is not None else self.created

    @property
    def exit_status(self) -> int | None:
        """How it ended as a shell shows it: the code, or 128+N for signal N."""
        if self.exit_signal:
            return 128 + self.exit_signal
        return self.exit_code

    @property
    def command_line(self) -> str:
        return " ".join(shlex.quote(str(a)) for a in self.command)


def record_from_wire(d: dict[str, Any]) -> JobRecord:
    """A JobRecord as the daemon sent it (dataclasses.asdict, through JSON:
    its pids' keys are strings); TypeError or ValueError for what can't be
    one."""
    known = {f.name for f in fields(JobRecord)}
    d = {k: v for k, v in d.items() if k in known}
    d["pids"] = {int(p): int(t) for p, t in (d.get("pids") or {}).items()}
    return JobRecord(**d)


def _f(kind: str, help: str, default: Any = None, unit: str = "") -> Any:
    return field(default=default, metadata={"kind": kind, "help": help, "unit": unit})


@dataclass
class JobView:
    """A job as every output shows it. The order of the fields is the order
    of ``ps --json``'s keys."""
    id: str = _f("text", "job id")
    name: str = _f("text", "job name")
    user: str = _f("text", "user name")
    uid: int = _f("int", "user id")
    state: str = _f("text", "starting, running, suspended or ended")
    pids: list[int] = _f("list", "its live processes")
    gpu: int | None = _f("int", "GPU index (its first GPU's)")
    gpu_uuid: str | None = _f("text", "GPU UUID (its first GPU's)")
    gpus: list[int] = _f("list", "the indices of its GPUs, in placement order")
    gpu_uuids: list[str] = _f("names", "the UUIDs of its GPUs, in placement order")
    mem_limit: int = _f("bytes", "memory limit on each of its GPUs")
    mem_limit_total: int = _f("bytes", "the memory limits of all its GPUs", 0)
    mem_used: int | None = _f("bytes", "memory it holds, all its GPUs (the hook's count)")
    mem_peak: int | None = _f("bytes", "highest memory it held, added up over its GPUs")
    mem_nvml: int | None = _f("bytes", "memory NVML reports for its processes, all its GPUs")
    over_limit: bool = _f("bool", "NVML's memory above the limit on one of its GPUs", False)
    oom_refusals: int | None = _f("int", "allocations refused for the limit")
    core: int = _f("int", "compute share target on each of its GPUs, percent", unit="%")
    core_measured: float | None = _f("share", "measured compute share, 0..1 (mean of its GPUs; "
                                     "CSV and tables: percent, as core)", unit="%")
    policy: str = _f("text", "hard or soft")
    priority: str = _f("text", "low, normal or high")
    promised: bool = _f("bool", "its share is promised (counted in its GPU's compute)", False)
    gated_launches: int | None = _f("int", "launches that waited at the compute gate")
    throttled_s: float | None = _f("seconds", "seconds spent waiting at the gate")
    per_gpu: list[dict[str, Any]] = _f(
        "per_gpu", "each of its GPUs: index, uuid, its limits and usage there")
    created: float | None = _f("time", "when it was admitted")
    started: float | None = _f("time", "when its command started")
    ended: float | None = _f("time", "when it ended")
    runtime_s: float = _f("seconds", "seconds it has run", 0.0)
    suspended_s: float = _f("seconds", "seconds it was suspended (not billed)", 0.0)
    suspend_reason: str | None = _f(
        "text", "while suspended: asked, preempted or drained")
    command: list[str] = _f("argv", "its command line")
    cwd: str = _f("text", "where it was started")
    exit_code: int | None = _f("int", "exit code, once ended")
    exit_signal: int | None = _f("int", "signal that ended it")
    violations: list[dict[str, Any]] = _f(
        "violations", "what the daemon caught (NVML against its limits)")
    slurm_job: str | None = _f("text", "its Slurm job id")
    slurm_partition: str | None = _f("text", "its Slurm partition")
    slurm_account: str | None = _f("text", "its Slurm account")
    slurm_shards: int | None = _f("int", "the Slurm shards it holds")
    region_error: str | None = _f("text", "why its usage region was found tampered with")

    def wire(self) -> dict[str, Any]:
        """The job as ``ps --json`` carries it."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class GpuView:
    """A GPU as every output shows it."""
    index: int = _f("int", "NVML index")
    uuid: str = _f("text", "GPU UUID")
    name: str = _f("text", "product name")
    memory_total: int = _f("bytes", "memory on the GPU")
    memory_used: int | None = _f("bytes", "memory in use (all processes)")
    utilization: int | None = _f("int", "percent busy, NVML's last sample")
    committed: int = _f("bytes", "sum of the limits of its jobs (suspended ones aside)", 0)
    capacity: int = _f("bytes", "what the limits may sum to", 0)
    core_promised: int = _f("int", "compute promised to its normal and high jobs, percent", 0)
    core_capacity: int = _f("int", "what the promises may sum to, percent", 100)
    jobs: int = _f("int", "jobs on it (suspended ones aside)", 0)
    drained: bool = _f("bool", "drained: no job is placed or resumed on it", False)
    minor: int | None = _f("int", "its device file's minor number (a MIG device: its GPU's)")
    slurm: bool = _f("bool", "Slurm hands it out ([slurm] gpus)", False)
    parent: int | None = _f("int", "a MIG device: the index of the GPU it is part of")
    mig: str | None = _f("text", "a MIG device: its profile (1g.10gb)")
    gi: int | None = _f("int", "a MIG device: its GPU instance's id")
    ci: int | None = _f("int", "a MIG device: its compute instance's id")

    def wire(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def field_table(cls: type) -> dict[str, Field]:
    """The output fields of a view class, in order."""
    return {f.name: Field(f.name, f.metadata["kind"], f.metadata["help"],
                          f.metadata.get("unit", "")) for f in fields(cls)}


JOB_FIELDS: dict[str, Field] = field_table(JobView)
GPU_FIELDS: dict[str, Field] = field_table(GpuView)


@dataclass(frozen=True)
class DeviceUsage:
    """What a job's usage region says of one of its GPUs, once validated
    (vgpuctl.core.tamper): the hook's counters."""
    used: int = 0
    peak: int = 0
    launches: int = 0
    throttled_ns: int = 0
    oom_refusals: int = 0
    busy_ns: int = 0            # GPU time the job's hooks measured
    borrowed_ns: int = 0        # ...of which in open spans
    cost_ns: int = 0            # one launch's, as last measured


@dataclass(frozen=True)
class GpuLive:
    """What is known of a running job on one of its GPUs: the hook's last
    trusted counters, NVML's memory for its processes, its measured share."""
    usage: DeviceUsage | None = None
    mem_nvml: int | None = None
    measured: float | None = None


@dataclass(frozen=True)
class Live:
    """What only exists while a job runs, for its view: each of its GPUs'
    (in placement order), and the violations caught."""
    gpus: tuple[GpuLive, ...] = ()
    violations: tuple[dict[str, Any], ...] = ()


def promised(rec: JobRecord) -> bool:
    """Whether a job's share is a promise its GPU's compute counts: one it
    asked for (--core, a Slurm job's shards), in a class that may be
    promised one (normal or high; low is best effort)."""
    return rec.core_promised and rec.priority != "low"


def _total(values: list[Any]) -> Any:
    """The sum of the known values, None when none is known."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


@dataclass(frozen=True)
class GpuPart:
    """A job's part on one of its GPUs: where it is, its limits and its
    usage there. `per_gpu` carries each as its wire form (the fields in
    this order are its keys); the metrics read them typed."""
    index: int | None
    uuid: str
    mem_limit: int              # bytes
    core: int                   # its share there, percent
    mem_used: int | None = None
    mem_peak: int | None = None
    mem_nvml: int | None = None
    over_limit: bool = False    # NVML's memory for its processes above the limit
    oom_refusals: int | None = None
    core_measured: float | None = None
    gated_launches: int | None = None
    throttled_s: float | None = None

    def wire(self) -> dict[str, Any]:
        """As `per_gpu` carries it."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _gpu_part(rec: JobRecord, i: int, g: JobGpu, gl: GpuLive) -> GpuPart:
    """A job's part on its i-th GPU."""
    u = gl.usage
    limit = rec.gpu_mem_limit(i)
    return GpuPart(
        index=g.index, uuid=g.uuid, mem_limit=limit,
        core=rec.gpu_core_share(i),
        mem_used=None if u is None else u.used,
        mem_peak=None if u is None else u.peak, mem_nvml=gl.mem_nvml,
        over_limit=bool(gl.mem_nvml is not None and gl.mem_nvml > limit),
        oom_refusals=None if u is None else u.oom_refusals,
        core_measured=gl.measured,
        gated_launches=None if u is None else u.launches,
        throttled_s=None if u is None else u.throttled_ns / 1e9)


def gpu_parts(rec: JobRecord, live: Live) -> list[GpuPart]:
    """A job's part on each of its GPUs, in placement order: what is known
    live only while it is active."""
    active = rec.active
    return [_gpu_part(rec, i, g, live.gpus[i] if active and i < len(live.gpus)
                      else GpuLive())
            for i, g in enumerate(rec.gpus)]


def job_view(rec: JobRecord, live: Live, now: float) -> JobView:
    """The view of a job: its record, and what is known of it live. Its
    usage is added up over its GPUs (its measured share averaged), and
    each GPU's is in per_gpu."""
    gpu = rec.gpus[0] if rec.gpus else JobGpu(None, "")
    active = rec.active
    end = rec.ended if rec.ended is not None else now
    parts = gpu_parts(rec, live)
    return JobView(
        id=rec.id, name=rec.name, user=rec.user, uid=rec.uid, state=rec.state,
        pids=sorted(rec.pids) if active else [],
        gpu=gpu.index, gpu_uuid=gpu.uuid or None,
        mem_limit=rec.mem_limit, core=rec.core_share,
        policy=rec.policy, priority=rec.priority, promised=promised(rec),
        per_gpu=[p.wire() for p in parts], **_summed(parts, rec.mem_limit),
        created=rec.created, started=rec.started, ended=rec.ended,
        runtime_s=max(0.0, end - rec.start),
        suspended_s=rec.suspended_for(end),
        suspend_reason=rec.suspend_reason if rec.state == SUSPENDED else None,
        command=list(rec.command), cwd=rec.cwd,
        exit_code=rec.exit_code, exit_signal=rec.exit_signal,
        violations=list(live.violations),
        slurm_job=rec.slurm_job, slurm_partition=rec.slurm_partition,
        slurm_account=rec.slurm_account, slurm_shards=rec.slurm_shards,
        region_error=rec.region_error)


def _summed(parts: list[GpuPart], mem_limit: int) -> dict[str, Any]:
    """A job's figures over its GPUs: each GPU's added up (None where none
    is known), its measured share averaged."""
    measured = [p.core_measured for p in parts if p.core_measured is not None]
    return dict(
        mem_used=_total([p.mem_used for p in parts]),
        mem_peak=_total([p.mem_peak for p in parts]),
        mem_nvml=_total([p.mem_nvml for p in parts]),
        oom_refusals=_total([p.oom_refusals for p in parts]),
        gated_launches=_total([p.gated_launches for p in parts]),
        throttled_s=_total([p.throttled_s for p in parts]),
        gpus=[p.index for p in parts], gpu_uuids=[p.uuid for p in parts],
        mem_limit_total=sum(p.mem_limit for p in parts) or mem_limit,
        over_limit=any(p.over_limit for p in parts),
        core_measured=sum(measured) / len(measured) if measured else None)
