"""Suspend, resume, move: the pure rules (docs/suspend.md).

- ``gpu_pairs``: the UUID pairs a restore is given to move a job's GPUs
  elsewhere. NVIDIA documents that the pairs must list every checkpointed
  GPU; drivers have been seen to want every GPU they see listed
  (cuda-python's migration tests map them all). A bijection of all the
  node's GPUs satisfies both: each GPU that moves swaps with its target, the
  others stay.
- ``unsuspendable``: what in a job's processes the driver can't checkpoint
  (managed memory, CUDA IPC: R570 refuses them), from the hook's slots.
- ``resume_target``: where a suspended job resumes when no GPU is named.
- ``victims``: the fewest preemptible jobs to suspend so that a job fits.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

FEATURE_MANAGED = 1     # region.h VGPU_FEATURE_MANAGED
FEATURE_IPC = 2         # region.h VGPU_FEATURE_IPC


def gpu_pairs(all_uuids: Sequence[str], moves: Mapping[str, str]) -> list[tuple[str, str]]:
    """(old, new) for every GPU of the node: each GPU in ``moves`` goes to
    its target, the GPUs taken the places they left, the rest stay. Empty
    when nothing moves. ValueError when ``moves`` is not one-to-one or names
    a GPU the node lacks."""
    moves = {o: n for o, n in moves.items() if o != n}
    if not moves:
        return []
    known = set(all_uuids)
    if not set(moves) <= known or not set(moves.values()) <= known:
        raise ValueError("a move names a GPU this node does not have")
    if len(set(moves.values())) != len(moves):
        raise ValueError("two GPUs can't move onto one")
    mapping = dict(moves)
    # The GPUs moved onto and not moving themselves go to the places left free.
    freed = [o for o in moves if o not in moves.values()]
    taken = [n for n in moves.values() if n not in moves]
    for n, o in zip(taken, freed, strict=True):
        mapping[n] = o
    return [(u, mapping.get(u, u)) for u in all_uuids]


def unsuspendable(features: Mapping[int, int]) -> str | None:
    """Why a job whose processes have these features (pid -> VGPU_FEATURE_*
    bits) can't be suspended, or None."""
    managed = sorted(p for p, f in features.items() if f & FEATURE_MANAGED)
    ipc = sorted(p for p, f in features.items() if f & FEATURE_IPC)
    why = []
    if managed:
        why.append(f"process {', '.join(map(str, managed))} uses managed memory "
                   "(cuMemAllocManaged)")
    if ipc:
        why.append(f"process {', '.join(map(str, ipc))} shares memory through CUDA IPC")
    if not why:
        return None
    return ("; ".join(why) + ", which the driver's checkpoint API can't take (docs/suspend.md)")


@dataclass(frozen=True)
class Room:
    """What one GPU can take now: by promises (its capacity less the
    limits of the jobs on it) and by what the driver says is free."""
    uuid: str
    index: int
    promised_left: int
    free: int | None        # bytes free by NVML; None: unknown


def resume_target(rooms: Sequence[Room], home: str | None, limit: int,
                  held: int) -> Room | None:
    """Where a job of this memory limit, holding ``held`` bytes, resumes: its
    own GPU (``home``) when it fits there, else the GPU with the most room
    left; None when none has room."""
    fits = [r for r in rooms
            if r.promised_left >= limit and (r.free is None or r.free >= held)]
    if not fits:
        return None
    for r in fits:
        if r.uuid == home:
            return r
    return max(fits, key=lambda r: (r.promised_left, -r.index))


@dataclass(frozen=True)
class Candidate:
    """A preemptible job on a GPU: its limit there, and when it started
    (the newest go first among equals)."""
    job_id: str
    mem: int
    started: float


def victims(candidates: Iterable[Candidate], short: int) -> list[str] | None:
    """The fewest candidates whose limits add up to at least ``short``
    bytes: among the fewest, the ones that free the least beyond what is
    needed, then the newest. None when all of them together don't."""
    cands = sorted(candidates, key=lambda c: (-c.mem, -c.started))
    if short <= 0:
        return []
    if sum(c.mem for c in cands) < short:
        return None
    # the fewest: take the largest first until it adds up
    n, total = 0, 0
    for c in cands:
        n += 1
        total += c.mem
        if total >= short:
            break
    # among sets of n, the one that frees the least past `short` (small n:
    # an exhaustive search is cheap; n is bounded by the jobs on one GPU)
    best: tuple[int, float, list[str]] | None = None
    if len(cands) <= 20:
        for combo in itertools.combinations(cands, n):
            freed = sum(c.mem for c in combo)
            if freed < short:
                continue
            key = (freed, -sum(c.started for c in combo))
            if best is None or key < best[:2]:
                best = (freed, key[1], [c.job_id for c in combo])
    if best is None:
        return [c.job_id for c in cands[:n]]
    return best[2]
