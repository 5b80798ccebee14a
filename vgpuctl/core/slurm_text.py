"""Slurm's `gres/shard` as vgpuctl limits: pure functions, no I/O.

- ``parse_job(text, node)``: what ``scontrol show job -d ID`` says of a job
  on one node (its shards, the GPUs they are on and how many on each,
  partition, account). A Prolog has no shard count in its environment, so
  it asks scontrol; the text form is used because Debian's 22.05 scontrol
  has no ``--json``. Slurm 23.11.2 and later write each GPU's count
  (``GRES=shard:20(16/16,4/16)``: allocated/available, one item per GPU in
  gres.conf's order); earlier versions only which GPUs (``(IDX:0)``), which
  says the count only for shards on one GPU.
- ``shards_per_gpu`` / ``shard_limits``: a GPU of capacity C carries
  ``floor(C / shard_size)`` shards; a job of N shards gets ``N * shard_size``
  of memory and ``N / shards_per_gpu`` of the compute time.
- ``gres_conf``: the ``gres.conf`` lines and the node's ``Gres=`` string for
  those counts, so that Slurm never admits what the daemon would refuse;
  ``slurm_order``: Slurm's order of a node's GPUs and MIG devices, which
  gres.conf's lines and the daemon's reading of Slurm's GPU index share.
- ``gone``: which registered Slurm jobs the controller no longer runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from vgpuctl.core.sizes import format_size
from vgpuctl.errors import AdmissionRefused, UsageError

# Job states after which the job holds nothing on the node (squeue %T).
# COMPLETING is not one: the Epilog has not run yet.
ENDED_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
    "OUT_OF_MEMORY", "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT",
})


@dataclass(frozen=True)
class SlurmJob:
    """What a Prolog needs to know of a Slurm job on its node."""

    job_id: str
    name: str = ""
    partition: str | None = None
    account: str | None = None
    command: str = ""
    work_dir: str = ""
    shards: int | None = None        # shards on this node; None: no shards here
    gpus: tuple[int, ...] = ()       # Slurm's GPU indices the shards are on
    # shards on each of gpus, in the same order; () when scontrol does not
    # say (Slurm before 23.11.2, shards on several GPUs)
    gpu_shards: tuple[int, ...] = ()


def _value(text: str, key: str) -> str | None:
    m = re.search(rf"(?:^|\s){re.escape(key)}=(\S*)", text)
    if m is None:
        return None
    v = m.group(1)
    return None if v in ("(null)", "") else v


def expand_hostlist(expr: str) -> list[str]:
    """Slurm's host list form into names: ``n[1-3,7],gpu05`` -> n1 n2 n3 n7
    gpu05 (numbers keep their zero padding)."""
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", expr):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if m is None:
            out.append(part)
            continue
        prefix, ranges, rest = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if not hi:
                out += [prefix + lo + x for x in expand_hostlist(rest)] if rest else [prefix + lo]
                continue
            for n in range(int(lo), int(hi) + 1):
                name = prefix + str(n).zfill(len(lo))
                out += [name + x for x in expand_hostlist(rest)] if rest else [name]
    return out


def _indices(spec: str) -> tuple[int, ...]:
    """``0-1,3`` -> (0, 1, 3)."""
    out: list[int] = []
    for r in spec.split(","):
        lo, _, hi = r.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise UsageError(f"unexpected GRES index {spec!r} in scontrol's output")
        out += range(int(lo), int(hi or lo) + 1)
    return tuple(out)


def _gres_items(gres: str) -> list[str]:
    """Split ``gpu:sim:1(IDX:0),shard:3(IDX:0-1)`` at the commas between items."""
    return [s for s in re.split(r",(?![^()]*\))", gres) if s]


def parse_job(text: str, node: str) -> SlurmJob:
    """A SlurmJob from ``scontrol show job -d`` text, as seen on ``node``.
    The per-node lines (``Nodes=n1 ... GRES=shard:4(IDX:0)``) give this
    node's shards and GPU; a job with no shards here has ``shards=None``."""
    job_id = _value(text, "JobId")
    if job_id is None or not job_id.isdigit():
        raise UsageError("scontrol's output names no job (JobId=)")
    shards, gpus, counts = _node_shards(text, node)
    where = tuple(sorted(set(gpus)))
    cmd_m = re.search(r"(?:^|\s)Command=(.*)$", text, re.M)
    return SlurmJob(job_id=job_id, name=_value(text, "JobName") or "",
                    partition=_value(text, "Partition"), account=_value(text, "Account"),
                    command=(cmd_m.group(1).strip() if cmd_m else ""),
                    work_dir=_value(text, "WorkDir") or "",
                    shards=shards, gpus=where,
                    gpu_shards=_gpu_shards(shards, where, counts))


def _node_gres(text: str, node: str) -> list[str]:
    """The GRES= of each per-node line that names ``node``."""
    out = []
    for line in text.splitlines():
        nodes = _value(line, "Nodes")
        gres = _value(line, "GRES")
        if nodes is not None and gres is not None and node in expand_hostlist(nodes):
            out.append(gres)
    return out


_SHARD_ITEM = re.compile(r"shard(?::[^:(]+)?:(\d+)(?:\(([^)]*)\))?")


def _node_shards(text: str, node: str) -> tuple[int | None, tuple[int, ...], dict[int, int]]:
    """This node's shards (None: none), the GPUs they are on (as often as
    scontrol names each) and, where scontrol says, how many on each GPU."""
    shards = None
    gpus: tuple[int, ...] = ()
    counts: dict[int, int] = {}
    for gres in _node_gres(text, node):
        for item in _gres_items(gres):
            m = _SHARD_ITEM.fullmatch(item)
            if m is None:
                continue
            shards = (shards or 0) + int(m.group(1))
            where_text = m.group(2) or ""
            if where_text.startswith("IDX:"):
                gpus += _indices(where_text[4:])
            elif where_text:
                for i, c in _per_gpu(where_text):
                    gpus += (i,)
                    counts[i] = counts.get(i, 0) + c
    return shards, gpus, counts


def _gpu_shards(shards: int | None, where: tuple[int, ...],
                counts: dict[int, int]) -> tuple[int, ...]:
    """The shards on each of the GPUs ``where``: scontrol's counts, checked
    against the total, or all of them on the one GPU; () when neither says."""
    if counts and sum(counts.values()) != shards:
        raise UsageError(f"scontrol's shards per GPU ({counts}) do not add up to {shards}")
    if not counts and len(where) == 1 and shards is not None:
        counts = {where[0]: shards}
    return tuple(counts[i] for i in where) if counts else ()


def _per_gpu(spec: str) -> list[tuple[int, int]]:
    """``16/16,4/16,0/16`` (Slurm 23.11.2+: allocated/available on each GPU,
    in gres.conf's order) -> [(0, 16), (1, 4)]: the GPUs with shards."""
    out = []
    for i, part in enumerate(spec.split(",")):
        got, _, avail = part.partition("/")
        if not got.isdigit() or not avail.isdigit():
            raise UsageError(f"unexpected shard counts {spec!r} in scontrol's output")
        if int(got):
            out.append((i, int(got)))
    return out


def shards_per_gpu(capacity: int, shard_size: int) -> int:
    """How many shards a GPU whose limits may sum to ``capacity`` carries."""
    if shard_size <= 0:
        raise UsageError("the shard size must be positive")
    return max(0, capacity // shard_size)


def shard_limits(shards: int, per_gpu: int, shard_size: int) -> tuple[int, int]:
    """(memory bytes, core percent) of a job of ``shards`` on a GPU of
    ``per_gpu`` shards; AdmissionRefused when Slurm's count and the
    daemon's disagree (more shards than the GPU carries)."""
    if shards < 1:
        raise UsageError(f"a job needs at least one shard, not {shards}")
    if shards > per_gpu:
        raise AdmissionRefused(
            f"{shards} shards of {format_size(shard_size)} do not fit: this GPU carries "
            f"{per_gpu} (gres.conf and vgpuctl disagree; see `vgpuctl slurm gres-conf`)")
    core = max(1, min(100, round(100 * shards / per_gpu)))
    return shards * shard_size, core


@dataclass(frozen=True)
class GresGpu:
    """A GPU or MIG device as gres.conf names it: the minor number of its
    /dev/nvidia<minor> (a MIG device's: its GPU's), its UUID and capacity;
    a MIG device also its GPU's index, its own inventory index (which orders
    its GPU's MIG devices by placement), profile, and GPU and compute
    instance ids."""

    minor: int
    uuid: str
    capacity: int
    index: int = 0
    parent: int | None = None
    mig: str | None = None
    gi: int | None = None
    ci: int | None = None

    @classmethod
    def of(cls, index: int, uuid: str, capacity: int, minor: int | None,
           parent: int | None = None, mig: str | None = None, gi: int | None = None,
           ci: int | None = None) -> GresGpu:
        """From what the daemon knows of a GPU (GpuView's fields); a minor
        NVML did not give is taken to be the GPU's index (a MIG device's:
        its GPU's)."""
        own = minor if minor is not None else index if parent is None else parent
        return cls(own, uuid, capacity, index, parent, mig, gi, ci)


def slurm_order(gpus: Iterable[GresGpu]) -> list[GresGpu]:
    """A node's GPUs in Slurm's order, the order of gres.conf's lines: its
    GPU index n is the n-th. Whole GPUs by device minor; a GPU in MIG mode
    has no line, its MIG devices take its place, by the slice their GPU
    instance starts at (their index: ``count + 8 x parent + start``)."""
    return sorted(gpus, key=lambda g: (g.minor, g.parent is not None, g.index))


_MIG_MINOR = re.compile(r"(gpu\d+/gi\d+(?:/ci\d+)?)/access\s+(\d+)")


def parse_mig_minors(text: str) -> dict[str, int]:
    """The driver's /proc/driver/nvidia-caps/mig-minors (``gpu0/gi1/access
    12``, ``gpu0/gi1/ci0/access 13``): the minor of each MIG capability's
    device file (/dev/nvidia-caps/nvidia-cap<minor>), by its name
    (``gpu0/gi1``, ``gpu0/gi1/ci0``; gpuN is the GPU's device minor)."""
    return {m.group(1): int(m.group(2))
            for m in map(_MIG_MINOR.fullmatch, text.split("\n")) if m is not None}


def _gres_file(g: GresGpu, dev_dir: str, mig_minors: Mapping[str, int] | None) -> str:
    """The device file of g's gres lines. A MIG device's is its compute
    instance's capability: Slurm splits a MultipleFiles= (its GPU's
    /dev/nvidiaN and its two capabilities) differently in gres/gpu and
    gres/shard, so no shard line can name one (docs/slurm.md, MIG devices)."""
    if g.parent is None:
        return f"{dev_dir}/nvidia{g.minor}"
    if g.gi is None or g.ci is None:
        raise UsageError(f"the daemon does not say MIG device {g.uuid}'s GPU and compute "
                         "instances: upgrade it")
    cap = f"gpu{g.minor}/gi{g.gi}/ci{g.ci}"
    minor = (mig_minors or {}).get(cap)
    if minor is None:
        raise UsageError(f"the MIG minors name no {cap}/access (MIG device {g.uuid}): "
                         "give this node's /proc/driver/nvidia-caps/mig-minors")
    return f"{dev_dir}/nvidia-caps/nvidia-cap{minor}"


def gres_conf(gpus: Sequence[GresGpu], shard_size: int, node: str = "",
              dev_dir: str = "/dev", gpu_type: str | None = None,
              mig_minors: Mapping[str, int] | None = None) -> str:
    """The gres.conf lines (in slurm_order: Slurm's indices are their
    positions) and, as a comment, the node's Gres= for slurm.conf. A MIG
    device's Type is Slurm's ``<gpu_type>_<profile>``; its files need the
    driver's MIG minors (parse_mig_minors)."""
    ordered = slurm_order(gpus)
    counts = [shards_per_gpu(g.capacity, shard_size) for g in ordered]
    files = [_gres_file(g, dev_dir, mig_minors) for g in ordered]
    types = [None if not gpu_type else f"{gpu_type}_{g.mig}" if g.parent is not None and g.mig
             else gpu_type for g in ordered]
    lines = [f"# vgpuctl: {format_size(shard_size)} shards; GPU n of Slurm is the n-th "
             f"gpu line below", "AutoDetect=off"]
    if any(g.parent is not None for g in ordered):
        lines.insert(1, "# a MIG device's File= is its compute instance's nvidia-cap "
                        "(vgpuctl help slurm: MIG devices)")
    for g, f, t in zip(ordered, files, types, strict=True):
        where = f" ({g.mig or 'MIG'} of {dev_dir}/nvidia{g.minor})" if g.parent is not None \
            else ""
        lines.append(f"Name=gpu{f' Type={t}' if t else ''} File={f} Flags=nvidia_gpu_env"
                     f"  # {g.uuid}{where}")
    for f, n in zip(files, counts, strict=True):
        lines.append(f"Name=shard Count={n} File={f} Flags=nvidia_gpu_env")
    per_type: dict[str | None, int] = {}
    for t in types:
        per_type[t] = per_type.get(t, 0) + 1
    gres = ",".join(f"gpu:{t + ':' if t else ''}{n}" for t, n in per_type.items())
    lines.append(f"# slurm.conf: NodeName={node or '<node>'} ... Gres={gres},shard:{sum(counts)}")
    return "\n".join(lines) + "\n"


def gone(registered: Iterable[str], states: Mapping[str, str]) -> list[str]:
    """The registered Slurm job ids that the controller's list (job id ->
    state, squeue --states=all) shows ended or no longer knows. An empty
    list says nothing (a controller that lost its state, or another
    cluster's): then none is gone."""
    if not states:
        return []
    out = []
    for job in registered:
        state = states.get(job)
        if state is None or state.split()[0].rstrip("+") in ENDED_STATES:
            out.append(job)
    return out


def parse_squeue(text: str) -> dict[str, str]:
    """``squeue -h -o '%A %T'`` lines into job id -> state (%A: the id each
    job array element has of its own, which its Prolog sees)."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            out[parts[0]] = parts[1]
    return out
