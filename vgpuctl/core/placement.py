"""Admission and placement: pure functions over dataclasses, no I/O.

The rule: on each GPU, the sum of the memory limits of its jobs stays at or
below its capacity, ``(total - reserve) * oversubscribe`` (oversubscribe 1.0
means none), and the sum of the compute shares promised there (the shares
normal and high jobs asked for) at or below 100 % x core_oversubscribe. A
job pinned with ``--gpu`` goes to that GPU or is refused; otherwise it goes
to the GPU with the most uncommitted memory among those with room for both
(ties: the lowest index). A refusal names every GPU considered and what it
has left.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vgpuctl.core.config import UserLimits
from vgpuctl.core.sizes import format_size
from vgpuctl.errors import AdmissionBusy, AdmissionRefused, NotFound, UsageError


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    total: int          # bytes of memory
    parent: int | None = None   # a MIG device: the index of its GPU
    mig: str | None = None      # ...and its profile


def check_mig_alone(gpus: Sequence[Gpu], spec: str) -> None:
    """A job's GPUs: one MIG device alone, or GPUs none of which is a MIG
    device. CUDA gives a process one MIG device and no other GPU beside it
    (docs/mig.md), so a job on more would see one of them."""
    mig = [g for g in gpus if g.parent is not None]
    if mig and len(gpus) > 1:
        raise AdmissionRefused(
            f"--gpu {spec.strip()}: GPU {mig[0].index} is a MIG device ({mig[0].mig} on GPU "
            f"{mig[0].parent}), and CUDA gives a process one MIG device and no other GPU "
            "beside it: a job on a MIG device has that one alone")


@dataclass(frozen=True)
class Commitment:
    """The memory limit a job holds on a GPU, and the compute share promised
    to it there (percent; 0 when none is)."""
    job_id: str
    uuid: str
    mem: int
    core: int = 0


@dataclass(frozen=True)
class Placement:
    gpu: Gpu
    capacity: int       # what the GPU may commit in all
    committed: int      # committed before this job
    mem: int            # this job's limit


def capacity(gpu: Gpu, reserve: int, oversubscribe: float = 1.0) -> int:
    """Bytes of limits the GPU may carry in all."""
    return max(0, int((gpu.total - reserve) * max(1.0, oversubscribe)))


def committed(commitments: Iterable[Commitment], exclude_job: str | None = None) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in commitments:
        if c.job_id != exclude_job:
            out[c.uuid] = out.get(c.uuid, 0) + c.mem
    return out


def core_capacity(core_oversubscribe: float = 1.0) -> int:
    """Percent of a GPU's compute the promised shares may sum to."""
    return int(round(100 * max(1.0, core_oversubscribe)))


def promised(commitments: Iterable[Commitment], exclude_job: str | None = None) -> dict[str, int]:
    """Percent of compute promised on each GPU."""
    out: dict[str, int] = {}
    for c in commitments:
        if c.job_id != exclude_job and c.core:
            out[c.uuid] = out.get(c.uuid, 0) + c.core
    return out


#: A name of this many digits or fewer is a GPU index and never a UUID
#: prefix: no node has 1,000 GPUs, and one hex digit matches a real GPU's
#: UUID about one time in 16 ("--gpu 7" on a 2-GPU node is an error, not
#: the GPU whose UUID starts with 7).
INDEX_DIGITS = 3
#: A UUID prefix names a GPU from this many of its characters after "GPU-".
PREFIX_MIN = 4


def resolve_gpu(gpus: Sequence[Gpu], spec: str) -> Gpu:
    """The GPU named by spec: an index ("0"), a UUID ("GPU-8f3a..."), or a
    unique prefix of a UUID of at least PREFIX_MIN characters (with or
    without "GPU-"). A number of up to INDEX_DIGITS digits is an index and
    nothing else; a longer one is a UUID prefix ("7668" is GPU-7668...)."""
    s = spec.strip()
    if not s:
        raise UsageError("--gpu: empty GPU name")
    if s.isdigit() and len(s) <= INDEX_DIGITS:
        for g in gpus:
            if g.index == int(s):
                return g
        raise NotFound(f"no GPU {s}: {_gpu_list(gpus)}")
    low = s.lower()
    for g in gpus:
        if g.uuid.lower() == low:
            return g
    bare = low[len("gpu-"):] if low.startswith(("gpu-", "mig-")) else low
    if len(bare) < PREFIX_MIN:
        raise NotFound(f"no GPU {s}: {_gpu_list(gpus)}; a UUID prefix needs at least "
                       f"{PREFIX_MIN} of its characters")
    matches = [g for g in gpus
               if g.uuid.lower().startswith(low) or g.uuid.lower()[4:].startswith(low)]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise UsageError(f"--gpu {s}: matches {len(matches)} GPUs "
                         f"({', '.join(g.uuid for g in matches)}); give more of the UUID")
    raise NotFound(f"no GPU {s}: {_gpu_list(gpus)}")


def _gpu_list(gpus: Sequence[Gpu]) -> str:
    """What GPUs there are, for a --gpu that names none of them."""
    if not gpus:
        return "this node has no GPUs"
    named = ", ".join(f"{g.index} ({g.uuid})" for g in gpus)
    if len(gpus) == 1:
        return f"the one GPU here is {named}"
    return f"the {len(gpus)} GPUs here are {named}"


def _left_text(gpus: Sequence[Gpu], used: dict[str, int], reserve: int,
               oversubscribe: float, cores: dict[str, int] | None = None,
               core_cap: int = 100) -> str:
    parts = []
    for g in gpus:
        cap = capacity(g, reserve, oversubscribe)
        left = max(0, cap - used.get(g.uuid, 0))
        text = f"GPU {g.index} ({g.name}) has {format_size(left)} left of {format_size(cap)}"
        if cores is not None:
            text += f" and {max(0, core_cap - cores.get(g.uuid, 0))}% of its compute unpromised"
        parts.append(text)
    out = "; ".join(parts)
    if reserve > 0 and gpus:
        out += (f" (a GPU's room is its memory less the {format_size(reserve)} kept for "
                "the driver and each process's context: `reserve` in the daemon's config)")
    return out


def place(gpus: Sequence[Gpu], commitments: Iterable[Commitment], mem: int, *,
          pin: str | None = None, reserve: int = 0, oversubscribe: float = 1.0,
          core: int = 0, core_oversubscribe: float = 1.0) -> Placement:
    """Choose a GPU for a job asking for mem bytes (and promised core percent
    of its compute; 0: none), or raise AdmissionRefused (NotFound /
    UsageError for a bad --gpu)."""
    if mem <= 0:
        raise UsageError("the memory limit must be positive")
    if not gpus:
        raise AdmissionRefused("no GPUs on this node")
    commitments = list(commitments)
    used = committed(commitments)
    cores = promised(commitments)
    core_cap = core_capacity(core_oversubscribe)
    candidates = [resolve_gpu(gpus, pin)] if pin is not None else list(gpus)
    best: Placement | None = None
    for g in candidates:
        cap = capacity(g, reserve, oversubscribe)
        have = used.get(g.uuid, 0)
        if have + mem <= cap and cores.get(g.uuid, 0) + core <= core_cap:
            p = Placement(g, cap, have, mem)
            if best is None or p.capacity - p.committed > best.capacity - best.committed:
                best = p
    if best is None:
        what = format_size(mem) + (f" and {core}% of a GPU's compute" if core else "")
        raise AdmissionRefused(f"no room for {what}: " + _left_text(
            candidates, used, reserve, oversubscribe, cores if core else None, core_cap))
    return best


def check_core(gpus: Sequence[Gpu], commitments: Iterable[Commitment], job_id: str,
               uuid: str, new_core: int, *, core_oversubscribe: float = 1.0) -> None:
    """Raise AdmissionRefused when job_id's promised share on GPU uuid can't
    become new_core percent (its own current one does not count against it)."""
    g = next((g for g in gpus if g.uuid == uuid), None)
    if g is None:
        raise NotFound(f"GPU {uuid} is no longer present")
    have = promised(commitments, exclude_job=job_id).get(uuid, 0)
    cap = core_capacity(core_oversubscribe)
    if have + new_core > cap:
        raise AdmissionRefused(
            f"no room for {new_core}% of GPU {g.index}'s compute: {have}% of its {cap}% is "
            f"promised to other jobs")


def resolve_gpus(gpus: Sequence[Gpu], spec: str) -> list[Gpu]:
    """The GPUs a ``--gpu A,B`` names, in its order (each as resolve_gpu
    reads it); a GPU named twice, under any of its names, is a UsageError."""
    names = [s.strip() for s in spec.split(",")]
    if not any(names) or (len(names) > 1 and not all(names)):
        raise UsageError(f"--gpu {spec.strip()!r}: expected GPUs separated by commas "
                         "(0,1 or UUID prefixes)")
    out: list[Gpu] = []
    for name in names:
        g = resolve_gpu(gpus, name)
        if g in out:
            raise UsageError(f"--gpu {spec.strip()}: GPU {g.index} ({g.uuid}) is named twice")
        out.append(g)
    return out


def _whole_gpus(gpus: Sequence[Gpu], n: int) -> list[Gpu]:
    """The GPUs a job of n GPUs may be placed on: a job on several GPUs
    can't have a MIG device among them. AdmissionRefused when fewer than n."""
    whole = [g for g in gpus if g.parent is None]
    if len(whole) < n:
        raise AdmissionRefused(
            f"--gpus {n}: there {'is' if len(whole) == 1 else 'are'} "
            f"{len(whole) or 'no'} whole GPU{'' if len(whole) == 1 else 's'} "
            f"here for it, and a job on several GPUs can't use MIG devices (CUDA gives "
            f"a process one MIG device and no other GPU beside it)")
    return whole


def check_count(count: int, gpus: Sequence[Gpu]) -> None:
    """A ``--gpus N`` that can never be placed here: N below 1 is a
    UsageError, N beyond the GPUs there are AdmissionRefused."""
    if count < 1:
        raise UsageError(f"--gpus {count}: a job needs at least one GPU")
    if count > len(gpus):
        have = "no GPU" if not gpus else f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''}"
        raise AdmissionRefused(f"--gpus {count}: there {'is' if len(gpus) == 1 else 'are'} "
                               f"{have} here for it ({_gpu_list(gpus)})")


def place_many(gpus: Sequence[Gpu], commitments: Iterable[Commitment], mem: int, *,
               count: int | None = None, pin: str | None = None, reserve: int = 0,
               oversubscribe: float = 1.0, core: int = 0,
               core_oversubscribe: float = 1.0) -> list[Placement]:
    """Place a job of ``mem`` bytes (and a promise of ``core`` percent of
    each GPU's compute; 0: none) on each of several GPUs, all or none: the
    GPUs ``pin`` names (``0,1``, in its order), or ``count`` GPUs chosen as
    `place` chooses one (most uncommitted memory first, ties by the lowest
    index) and given in index order. AdmissionRefused names what every GPU
    considered has left when fewer fit than asked for."""
    if mem <= 0:
        raise UsageError("the memory limit must be positive")
    if count is not None and pin is not None:
        raise UsageError("--gpus and --gpu: give one (--gpus N picks N GPUs, "
                         "--gpu A,B names them)")
    if pin is None:
        n = 1 if count is None else count
        check_count(n, gpus)
        if n == 1:
            return [place(gpus, commitments, mem, reserve=reserve,
                          oversubscribe=oversubscribe, core=core,
                          core_oversubscribe=core_oversubscribe)]
        candidates = _whole_gpus(gpus, n)
    else:
        if not gpus:
            raise AdmissionRefused("no GPUs on this node")
        candidates = resolve_gpus(gpus, pin)
        check_mig_alone(candidates, pin)
        n = len(candidates)
    commitments = list(commitments)
    used = committed(commitments)
    cores = promised(commitments)
    core_cap = core_capacity(core_oversubscribe)
    fits = [Placement(g, cap, used.get(g.uuid, 0), mem) for g in candidates
            if used.get(g.uuid, 0) + mem <= (cap := capacity(g, reserve, oversubscribe))
            and cores.get(g.uuid, 0) + core <= core_cap]
    if len(fits) < n:
        short = candidates if pin is None else [g for g in candidates
                                                if g not in [p.gpu for p in fits]]
        raise AdmissionRefused(
            _no_room_many(mem, core, candidates, n, len(fits), pin is not None) + ": "
            + _left_text(short, used, reserve, oversubscribe, cores if core else None,
                         core_cap))
    if pin is not None:
        return fits
    fits.sort(key=lambda p: (-(p.capacity - p.committed), p.gpu.index))
    return sorted(fits[:n], key=lambda p: p.gpu.index)


def _no_room_many(mem: int, core: int, candidates: Sequence[Gpu], n: int, fit: int,
                  pinned: bool) -> str:
    """What a job placed on several GPUs did not find room for, and where."""
    what = format_size(mem) + (f" and {core}% of the compute" if core else "")
    if pinned:
        return f"no room for {what} on each of GPUs {','.join(str(g.index) for g in candidates)}"
    return f"no room for {what} on each of {n} GPUs ({fit} ha{'s' if fit == 1 else 've'} it)"


def check_resize(gpus: Sequence[Gpu], commitments: Iterable[Commitment], job_id: str,
                 uuid: str, new_mem: int, *, reserve: int = 0,
                 oversubscribe: float = 1.0) -> None:
    """Raise AdmissionRefused when job_id's limit on GPU uuid can't become
    new_mem (its own current limit does not count against it)."""
    if new_mem <= 0:
        raise UsageError("the memory limit must be positive")
    g = next((g for g in gpus if g.uuid == uuid), None)
    if g is None:
        raise NotFound(f"GPU {uuid} is no longer present")
    used = committed(commitments, exclude_job=job_id)
    cap = capacity(g, reserve, oversubscribe)
    if used.get(uuid, 0) + new_mem > cap:
        raise AdmissionRefused(f"no room for {format_size(new_mem)}: "
                               + _left_text([g], used, reserve, oversubscribe))


# What a CUDA context takes on a real GPU before the job allocates anything:
# about 300 to 500 MiB on current GPUs and drivers (the hook measures it per
# process through NVML; the simulator charges VGPU_SIM_CTX_MEM, 300M).
CONTEXT_MEM = 300 << 20


def context_warning(mem: int, context_mem: int) -> str | None:
    """What to tell the user of a job whose memory limit leaves no room past
    one CUDA context (the context counts against the limit), or None."""
    if context_mem <= 0 or mem > context_mem:
        return None
    return (f"--mem {format_size(mem)} is not more than a CUDA context takes on this GPU "
            f"(about {format_size(context_mem)}, counted against the limit): the job's "
            f"first context or allocation will fail with out of memory")


def check_user_total(limits: UserLimits, user: str, held: int, mem: int,
                     node_capacity: int = 0) -> None:
    """Raise AdmissionRefused when a job of mem bytes would take a user's live
    jobs (holding ``held`` bytes of limits) over their max_total_mem (a
    size, or a share of the node's capacity, the sum of its GPUs')."""
    caps = []
    if limits.max_total_mem is not None:
        caps.append((limits.max_total_mem, ""))
    if limits.max_total_share is not None and node_capacity > 0:
        caps.append((int(node_capacity * limits.max_total_share),
                     f" ({limits.max_total_share:.0%} of this node's capacity)"))
    for cap, what in caps:
        if held + mem > cap:
            raise AdmissionRefused(f"user {user} may hold at most {format_size(cap)}{what} in "
                                   f"all jobs; they hold {format_size(held)} and asked for "
                                   f"{format_size(mem)} more")


def check_user_jobs(limits: UserLimits, user: str, live: int, starting: int) -> None:
    """Raise when a user with ``live`` jobs, ``starting`` of them not started
    yet, may not have one more: AdmissionRefused past max_jobs,
    AdmissionBusy past max_starting (one of them starts in a moment)."""
    if limits.max_jobs is not None and live >= limits.max_jobs:
        raise AdmissionRefused(f"user {user} has {live} jobs, the most a user may have "
                               f"here (max_jobs); end one first")
    if limits.max_starting is not None and starting >= limits.max_starting:
        raise AdmissionBusy(f"user {user} has {starting} jobs starting, the most a user "
                            f"may have (max_starting): try again when one has started")


class AdmissionRate:
    """How fast each user may be admitted: a token bucket per uid of
    ``rate`` admissions a second, holding twice that (at least one)."""

    def __init__(self) -> None:
        self._buckets: dict[int, tuple[float, float]] = {}   # uid -> (tokens, at)

    def take(self, uid: int, rate: float | None, now: float) -> bool:
        """Whether uid may be admitted now (and count it)."""
        if rate is None:
            return True
        cap = max(1.0, 2 * rate)
        tokens, at = self._buckets.get(uid, (cap, now))
        tokens = min(cap, tokens + max(0.0, now - at) * rate)
        if tokens < 1.0:
            self._buckets[uid] = (tokens, now)
            return False
        self._buckets[uid] = (tokens - 1.0, now)
        if len(self._buckets) > 4096:       # forget those not seen for a while
            self._buckets = {u: b for u, b in self._buckets.items() if now - b[1] < 600}
        return True


def check_user_limits(limits: UserLimits, user: str, mem: int | None, core: int | None) -> None:
    """Raise AdmissionRefused when a job's limits exceed what its user may ask."""
    if mem is not None and limits.max_mem is not None and mem > limits.max_mem:
        raise AdmissionRefused(f"user {user} may ask for at most {format_size(limits.max_mem)} "
                               f"per job, not {format_size(mem)}")
    if core is not None and limits.max_core is not None and core > limits.max_core:
        raise AdmissionRefused(f"user {user} may ask for at most {limits.max_core}% core "
                               f"per job, not {core}%")
